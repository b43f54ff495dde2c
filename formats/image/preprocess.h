#pragma once
// Pixels in and out of the model: reference images prepared as the official
// Flux2KleinPipeline prepares them (spec h.1, g.5), and decoder output turned into 8-bit RGB.
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "formats/image/image.h"

namespace klein {

constexpr int kReferenceMinSide = 64;       // pixels, both sides
constexpr double kReferenceMaxAspect = 8.0;  // longer side / shorter side
constexpr int64_t kReferenceMaxArea = 1024 * 1024;
constexpr int kReferenceMultiple = 16;  // VAE downsampling (8) x patch size (2)

struct ImageSize {
  int width = 0;
  int height = 0;
};

// Throws unless both sides are at least 64 pixels and the aspect ratio is at most 8:1;
// `name` (the file) is named in the message.
void check_reference_size(const std::string& name, int width, int height);

// The size a reference is resized to: unchanged up to 1024*1024 pixels, otherwise
// (int(w*s), int(h*s)) with s = sqrt(1024^2 / (w*h)), truncated like Python's int().
ImageSize reference_resize_target(int width, int height);

// The pixels of `image` inside the rectangle; it must lie within the image.
Image crop(const Image& image, int left, int top, int width, int height);

// Both sides floored to a multiple of `multiple` by cutting the excess evenly, the extra pixel
// of an odd excess going to the right and bottom (left = floor((w - W') / 2)).
Image center_crop_to_multiple(const Image& image, int multiple);

// Validation, Lanczos resize above one megapixel, center crop to multiples of 16: the pixels
// the VAE encodes. `name` is used in error messages.
Image prepare_reference(const Image& image, const std::string& name);

// The width x height window around the image's centre (left = floor((w - width) / 2), top
// likewise, Python's floor division); what lies outside the image is black. The official
// Flux2 image processor's "crop" mode, which the image-to-image pipeline applies to its init
// image (it does not scale).
Image crop_centered(const Image& image, int width, int height);

// An init image for image-to-image: scaled down to one megapixel when larger (as a reference
// is), its size floored to multiples of 16. The size the output takes unless told otherwise.
ImageSize init_image_size(const Image& image);

// An inpainting mask as the official mask processor reads it: grey (ITU-R 601 luma, as PIL's
// "L"), scaled (Lanczos) to width x height when its size differs, 1 where the grey value is
// at least half of 255 (white: repaint), 0 elsewhere. [height * width], row-major.
std::vector<float> binary_mask(const Image& image, int width, int height);

// A [height, width] map bilinearly resampled to rows x cols (half-pixel centres, no
// antialiasing: torch's interpolate(mode="bilinear")). Row-major.
std::vector<float> resample_bilinear(const std::vector<float>& map, int height, int width,
                                     int rows, int cols);

// [3, H, W] float32 in [-1, 1]: 2 * (p / 255) - 1, in float32 as the pipeline computes it.
Tensor image_to_tensor(const Image& image);

// Decoder output [3, H, W] or [1, 3, H, W] to 8-bit RGB: u = clamp(0.5 * y + 0.5, 0, 1) in
// float32, then round(255 * u) with ties to even (numpy's rounding). NaN becomes 0.
Image tensor_to_image(const Tensor& chw);
Image tensor_to_image(const float* chw, int height, int width);

// A decoded image [3, H, W] or [1, 3, H, W] in [-1, 1] to 8-bit RGB as BFL's safety check
// converts it before classifying (flux2's text_encoder.py:
// (127.5 * (x.clamp(-1, 1) + 1.0)).byte()): clamp, add 1, multiply by 127.5, each in float32,
// then truncate toward zero (no rounding, unlike tensor_to_image). NaN becomes 0.
Image tensor_to_image_truncated(const Tensor& chw);

// load_image + prepare_reference + image_to_tensor: a reference file as the VAE input.
Tensor load_reference(const std::filesystem::path& path, const ImageLimits& limits = {});

}  // namespace klein
