#include "models/vit/preprocess.h"

#include <array>

#include "core/error.h"
#include "formats/image/resize.h"

namespace klein::vit {

Image resize_for_classifier(const Image& rgb, const VitImageProcessor& p) {
  check(rgb.width > 0 && rgb.height > 0, "safety classifier: empty image");
  if (!p.do_resize) return rgb;
  return resize_bilinear(rgb, p.width, p.height);
}

Tensor to_pixel_values(const Image& resized, const VitImageProcessor& p) {
  const int64_t H = resized.height, W = resized.width, plane = H * W;
  // One value per byte and channel, each step rounded as transformers rounds it: the rescale
  // in float64 (numpy's uint8 -> float64 product), stored as float32; the normalisation in
  // float32 (mean and std as float32 arrays).
  std::array<std::array<float, 256>, 3> table{};
  for (size_t c = 0; c < 3; ++c)
    for (int b = 0; b < 256; ++b) {
      float v = p.do_rescale ? float(double(b) * p.rescale_factor) : float(b);
      if (p.do_normalize) v = (v - p.image_mean[c]) / p.image_std[c];
      table[c][size_t(b)] = v;
    }
  Tensor out({3, H, W});  // [C, H, W]
  float* dst = out.data();
  const uint8_t* src = resized.rgb.data();
  for (int64_t i = 0; i < plane; ++i)
    for (int64_t c = 0; c < 3; ++c) dst[c * plane + i] = table[size_t(c)][src[3 * i + c]];
  return out;
}

Tensor pixel_values(const Image& rgb, const VitImageProcessor& p) {
  return to_pixel_values(resize_for_classifier(rgb, p), p);
}

}  // namespace klein::vit
