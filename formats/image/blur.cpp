#include "formats/image/blur.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace klein {

namespace {

// One box pass over `n` samples `stride` bytes apart (one channel of a row or a column),
// from `src` into `dst`, with the border samples repeated beyond the ends.
void box_line(const uint8_t* src, uint8_t* dst, int n, size_t stride, int radius) {
  const int64_t width = 2 * int64_t(radius) + 1;
  auto at = [&](int64_t i) {
    return int64_t(src[size_t(std::clamp<int64_t>(i, 0, n - 1)) * stride]);
  };
  int64_t sum = 0;
  for (int64_t i = -radius; i <= radius; ++i) sum += at(i);
  for (int64_t i = 0; i < n; ++i) {
    dst[size_t(i) * stride] = uint8_t((sum + width / 2) / width);
    sum += at(i + radius + 1) - at(i - radius);
  }
}

}  // namespace

void box_blur(Image& image, int radius, int passes) {
  check(radius >= 0 && passes >= 0, "box_blur: radius ", radius, " and passes ", passes,
        " must not be negative");
  if (radius == 0 || image.width == 0 || image.height == 0) return;
  const int w = image.width, h = image.height;
  std::vector<uint8_t> tmp(image.rgb.size());
  for (int p = 0; p < passes; ++p) {
    for (int y = 0; y < h; ++y)  // rows: image -> tmp
      for (int c = 0; c < 3; ++c)
        box_line(image.row(y) + c, tmp.data() + size_t(y) * image.row_bytes() + c, w, 3, radius);
    for (int x = 0; x < w; ++x)  // columns: tmp -> image
      for (int c = 0; c < 3; ++c)
        box_line(tmp.data() + size_t(x) * 3 + c, image.rgb.data() + size_t(x) * 3 + c, h,
                 image.row_bytes(), radius);
  }
}

int strong_blur_radius(int width, int height) { return std::max(1, std::max(width, height) / 8); }

}  // namespace klein
