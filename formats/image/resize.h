#pragma once
// Lanczos resampling that reproduces PIL's Image.resize(size, Image.LANCZOS) on RGB images
// bit for bit, so that references larger than a megapixel reach the VAE as in the official
// pipeline.
#include "formats/image/image.h"

namespace klein {

// Resamples `image` to width x height with a Lanczos-3 filter, separably (rows first, then
// columns, each pass rounded to 8 bits), the filter widened by the scale factor when shrinking
// and PIL's 22-bit fixed-point weights. A dimension that keeps its size is not filtered.
Image resize_lanczos(const Image& image, int width, int height);

}  // namespace klein
