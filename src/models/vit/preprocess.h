#pragma once
// ViTImageProcessor's preprocessing (the slow one, which BFL's pipeline loads), on an image
// already loaded as transformers' load_image leaves it (EXIF orientation applied, RGB with
// alpha dropped: formats/image/image.h):
//   resize   to height x width with PIL's BILINEAR on the 8-bit image (aspect ratio not
//            kept, no crop): formats/image/resize.h
//   rescale  byte * rescale_factor in float64, then rounded to float32
//   normalise (x - mean) / std per channel in float32
//   -> [3, H, W] float32 (CHW)
#include "core/tensor.h"
#include "formats/image/image.h"
#include "weights/safety_model.h"

namespace klein::vit {

// The resize step alone (the image itself when do_resize is off or the size already fits).
Image resize_for_classifier(const Image& rgb, const VitImageProcessor& p);

// Rescale and normalise an image of the classifier's size: [3, H, W].
Tensor to_pixel_values(const Image& resized, const VitImageProcessor& p);

// Both steps: what the classifier reads.
Tensor pixel_values(const Image& rgb, const VitImageProcessor& p);

}  // namespace klein::vit
