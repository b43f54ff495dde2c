#include "formats/image/preprocess.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "formats/image/resize.h"

namespace klein {

namespace {

// p / 255 * 2 - 1 for every byte value, each step rounded to float32 like the pipeline's
// numpy division followed by a torch multiply-subtract.
std::array<float, 256> byte_to_signed_unit() {
  std::array<float, 256> table{};
  for (int p = 0; p < 256; ++p) {
    const float unit = float(p) / 255.0f;
    table[size_t(p)] = 2.0f * unit - 1.0f;
  }
  return table;
}

uint8_t signed_unit_to_byte(float y) {
  float u = y / 2.0f + 0.5f;
  if (!(u >= 0.0f)) u = 0.0f;  // also NaN
  if (u > 1.0f) u = 1.0f;
  // nearbyint rounds ties to even under the default rounding mode, as numpy's round().
  return uint8_t(std::nearbyint(u * 255.0f));
}

std::string ratio_text(double ratio) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << ratio;
  return out.str();
}

}  // namespace

void check_reference_size(const std::string& name, int width, int height) {
  check(width >= kReferenceMinSide && height >= kReferenceMinSide, name,
        ": reference image is too small (", width, "x", height, "); both sides must be at least ",
        kReferenceMinSide, " pixels");
  const double ratio = std::max(double(width) / height, double(height) / width);
  check(ratio <= kReferenceMaxAspect, name, ": reference image of ", width, "x", height,
        " has an aspect ratio of ", ratio_text(ratio), ":1; at most ", kReferenceMaxAspect,
        ":1 is allowed");
}

ImageSize reference_resize_target(int width, int height) {
  const double area = double(width) * double(height);
  if (area <= double(kReferenceMaxArea)) return {width, height};
  const double scale = std::sqrt(double(kReferenceMaxArea) / area);
  return {int(width * scale), int(height * scale)};
}

Image crop(const Image& image, int left, int top, int width, int height) {
  check(left >= 0 && top >= 0 && width > 0 && height > 0 && left + width <= image.width &&
            top + height <= image.height,
        "crop: ", width, "x", height, " at (", left, ", ", top, ") is outside the ", image.width,
        "x", image.height, " image");
  Image out(width, height);
  for (int y = 0; y < height; ++y)
    std::memcpy(out.row(y), image.pixel(left, top + y), out.row_bytes());
  return out;
}

Image center_crop_to_multiple(const Image& image, int multiple) {
  const int width = image.width / multiple * multiple;
  const int height = image.height / multiple * multiple;
  check(width > 0 && height > 0, "crop: ", image.width, "x", image.height,
        " image is smaller than ", multiple, " pixels");
  if (width == image.width && height == image.height) return image;
  return crop(image, (image.width - width) / 2, (image.height - height) / 2, width, height);
}

Image prepare_reference(const Image& image, const std::string& name) {
  check_reference_size(name, image.width, image.height);
  const ImageSize target = reference_resize_target(image.width, image.height);
  if (target.width == image.width && target.height == image.height)
    return center_crop_to_multiple(image, kReferenceMultiple);
  return center_crop_to_multiple(resize_lanczos(image, target.width, target.height),
                                 kReferenceMultiple);
}

Image crop_centered(const Image& image, int width, int height) {
  check(width > 0 && height > 0, "crop: target ", width, "x", height, " is empty");
  auto floor_half = [](int v) { return v >= 0 ? v / 2 : -((1 - v) / 2); };
  const int left = floor_half(image.width - width), top = floor_half(image.height - height);
  Image out(width, height);
  std::fill(out.rgb.begin(), out.rgb.end(), uint8_t(0));
  for (int y = 0; y < height; ++y) {
    const int sy = y + top;
    if (sy < 0 || sy >= image.height) continue;
    for (int x = 0; x < width; ++x) {
      const int sx = x + left;
      if (sx >= 0 && sx < image.width) std::memcpy(out.pixel(x, y), image.pixel(sx, sy), 3);
    }
  }
  return out;
}

ImageSize init_image_size(const Image& image) {
  const ImageSize s = reference_resize_target(image.width, image.height);
  return {s.width / kReferenceMultiple * kReferenceMultiple,
          s.height / kReferenceMultiple * kReferenceMultiple};
}

std::vector<float> binary_mask(const Image& image, int width, int height) {
  // PIL's RGB -> L: (299 R + 587 G + 114 B) / 1000, in 16-bit fixed point with rounding.
  Image grey(image.width, image.height);
  for (size_t i = 0; i < image.rgb.size(); i += 3) {
    const uint32_t l = (uint32_t(image.rgb[i]) * 19595 + uint32_t(image.rgb[i + 1]) * 38470 +
                        uint32_t(image.rgb[i + 2]) * 7471 + 0x8000) >> 16;
    grey.rgb[i] = grey.rgb[i + 1] = grey.rgb[i + 2] = uint8_t(l);
  }
  if (grey.width != width || grey.height != height) grey = resize_lanczos(grey, width, height);
  std::vector<float> mask(size_t(width) * size_t(height));
  for (size_t i = 0; i < mask.size(); ++i)
    mask[i] = float(grey.rgb[i * 3]) / 255.0f < 0.5f ? 0.0f : 1.0f;
  return mask;
}

std::vector<float> resample_bilinear(const std::vector<float>& map, int height, int width,
                                     int rows, int cols) {
  // Source coordinate of output index d: (d + 0.5) * in / out - 0.5, clamped at 0.
  struct Tap {
    int lo, hi;
    float w;  // weight of hi
  };
  auto taps = [](int in, int out) {
    std::vector<Tap> t(static_cast<size_t>(out), Tap{0, 0, 0.0f});
    const float scale = float(in) / float(out);
    for (int d = 0; d < out; ++d) {
      const float src = std::max(0.0f, (float(d) + 0.5f) * scale - 0.5f);
      const int lo = std::min(int(src), in - 1);
      t[size_t(d)] = {lo, std::min(lo + 1, in - 1), src - float(lo)};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(height, rows), tx = taps(width, cols);
  std::vector<float> out(size_t(rows) * size_t(cols));
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const Tap& y = ty[size_t(r)];
      const Tap& x = tx[size_t(c)];
      auto at = [&](int yy, int xx) { return map[size_t(yy) * size_t(width) + size_t(xx)]; };
      const float top = (1 - x.w) * at(y.lo, x.lo) + x.w * at(y.lo, x.hi);
      const float bottom = (1 - x.w) * at(y.hi, x.lo) + x.w * at(y.hi, x.hi);
      out[size_t(r) * size_t(cols) + size_t(c)] = (1 - y.w) * top + y.w * bottom;
    }
  return out;
}

Tensor image_to_tensor(const Image& image) {
  static const std::array<float, 256> table = byte_to_signed_unit();
  const int64_t plane = int64_t(image.width) * image.height;
  Tensor out({3, image.height, image.width});
  float* dst = out.data();
  for (int64_t i = 0; i < plane; ++i) {
    const uint8_t* p = image.rgb.data() + i * 3;
    dst[i] = table[p[0]];
    dst[plane + i] = table[p[1]];
    dst[2 * plane + i] = table[p[2]];
  }
  return out;
}

Image tensor_to_image(const float* chw, int height, int width) {
  const int64_t plane = int64_t(width) * height;
  Image out(width, height);
  uint8_t* dst = out.rgb.data();
  for (int64_t i = 0; i < plane; ++i) {
    dst[3 * i + 0] = signed_unit_to_byte(chw[i]);
    dst[3 * i + 1] = signed_unit_to_byte(chw[plane + i]);
    dst[3 * i + 2] = signed_unit_to_byte(chw[2 * plane + i]);
  }
  return out;
}

Image tensor_to_image(const Tensor& chw) {
  const Shape& s = chw.shape();
  const bool planar = (s.size() == 3 && s[0] == 3) || (s.size() == 4 && s[0] == 1 && s[1] == 3);
  check(planar, "image tensor must be [3, H, W] or [1, 3, H, W], got ", shape_str(s));
  return tensor_to_image(chw.data(), int(s[s.size() - 2]), int(s[s.size() - 1]));
}

Image tensor_to_image_truncated(const Tensor& chw) {
  const Shape& s = chw.shape();
  const bool planar = (s.size() == 3 && s[0] == 3) || (s.size() == 4 && s[0] == 1 && s[1] == 3);
  check(planar, "image tensor must be [3, H, W] or [1, 3, H, W], got ", shape_str(s));
  const int height = int(s[s.size() - 2]), width = int(s[s.size() - 1]);
  const int64_t plane = int64_t(width) * height;
  Image out(width, height);
  for (int64_t i = 0; i < plane; ++i)
    for (int64_t c = 0; c < 3; ++c) {
      const float x = std::clamp(chw.data()[c * plane + i], -1.0f, 1.0f);
      const float v = 127.5f * (x + 1.0f);                      // in [0, 255]
      out.rgb[size_t(3 * i + c)] = v >= 0.0f ? uint8_t(v) : 0;  // truncates; NaN is 0
    }
  return out;
}

Tensor load_reference(const std::filesystem::path& path, const ImageLimits& limits) {
  return image_to_tensor(prepare_reference(load_image(path, limits), path.string()));
}

}  // namespace klein
