#pragma once
// A strong blur of an 8-bit image: what `--safety-action blur` writes instead of an image
// the safety classifier flagged, so that nothing in it is recognisable.
#include "formats/image/image.h"

namespace klein {

// `passes` box blurs of width 2·radius + 1 along rows, then along columns (edges repeat the
// border pixel); three passes approach a Gaussian of σ ≈ radius. Exact integer averages,
// rounded; the same bytes on every machine.
void box_blur(Image& image, int radius, int passes = 3);

// The radius that leaves no detail: an eighth of the longer side (at least 1), so that a
// 1024x1024 image is blurred with σ ≈ 128 pixels.
int strong_blur_radius(int width, int height);

}  // namespace klein
