#pragma once
// Resampling that reproduces PIL's Image.resize on RGB images bit for bit: LANCZOS, so that
// references larger than a megapixel reach the VAE as in the official pipeline, and BILINEAR,
// which the safety classifier's ViTImageProcessor resizes with.
#include "formats/image/image.h"

namespace klein {

// Resamples `image` to width x height with a Lanczos-3 filter, separably (rows first, then
// columns, each pass rounded to 8 bits), the filter widened by the scale factor when shrinking
// and PIL's 22-bit fixed-point weights. A dimension that keeps its size is not filtered.
Image resize_lanczos(const Image& image, int width, int height);

// The same with PIL's BILINEAR filter: a triangle of support 1 input pixel at scale 1, widened
// by the scale factor when shrinking (antialiased, unlike torch's bilinear interpolation), the
// same fixed-point weights and 8-bit passes.
Image resize_bilinear(const Image& image, int width, int height);

}  // namespace klein
