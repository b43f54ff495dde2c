#pragma once
// Canny edges as OpenCV's cv::Canny computes them with its defaults (aperture 3, L1 gradient),
// on the RGB image as ControlNet preprocessors pass it (controlnet_aux's CannyDetector):
//   dx, dy     Sobel 3x3 per channel, borders replicated, in integers
//   magnitude  |dx| + |dy|; per pixel the channel with the largest one (the first on ties)
//              gives the magnitude and the direction
//   thinning   a pixel stays when its magnitude is above `low` and a local maximum across the
//              edge: along the row when |dy| < tan(22.5°)·|dx|, along the column when
//              |dy| > tan(67.5°)·|dx|, else along the diagonal that dx·dy's sign picks (in
//              15-bit fixed point, tan 22.5° = 13573/2^15; strictly greater than the neighbour
//              before, at least the one after, strictly both on diagonals); outside the image
//              the magnitude is 0
//   hysteresis the pixels that stayed and are above `high`, and every stayed pixel 8-connected
//              to them through stayed pixels
// Thresholds are floored to integers and swapped when low > high. The result: 255 on edges,
// 0 elsewhere, in all three channels (a control image).
#include "formats/image/image.h"

namespace klein {

Image canny_edges(const Image& rgb, double low, double high);

}  // namespace klein
