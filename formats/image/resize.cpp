#include "formats/image/resize.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/error.h"

namespace klein {

namespace {

// Weights are fixed-point with 22 fraction bits: 8 bits of pixel value and 2 spare bits
// (negative lobes can push a sum below 0 or above 255) still fit a 32-bit sum, which is the
// arithmetic PIL's 8-bit path uses and whose rounding we reproduce.
constexpr int kFractionBits = 32 - 8 - 2;
constexpr int64_t kHalf = int64_t(1) << (kFractionBits - 1);

double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= std::numbers::pi;
  return std::sin(x) / x;
}

// PIL's filters: a kernel and its support (in input pixels at scale 1).
struct Filter {
  double support;
  double (*kernel)(double);
};

// Lanczos-3: the kernel spans [-3, 3) input pixels at scale 1.
constexpr Filter kLanczos3 = {3.0, [](double x) {
  if (-3.0 <= x && x < 3.0) return sinc(x) * sinc(x / 3.0);
  return 0.0;
}};

// The triangle 1 - |x| on (-1, 1).
constexpr Filter kBilinear = {1.0, [](double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}};

int32_t to_fixed(double w) {
  const double scaled = w * double(1 << kFractionBits);
  return int32_t(w < 0 ? scaled - 0.5 : scaled + 0.5);  // round half away from zero
}

// For every output pixel along one axis: the first input pixel it reads, how many it reads and
// their weights (`stride` slots per output pixel, unused ones zero).
struct Taps {
  int stride = 0;
  std::vector<int> first;
  std::vector<int> count;
  std::vector<int32_t> weights;

  const int32_t* of(int i) const { return weights.data() + size_t(i) * size_t(stride); }
};

// The weights PIL computes in double precision and then rounds to fixed point, step for step
// (the same truncating casts and the same order of operations), since one unit of difference in
// a weight can move a pixel by one level.
Taps filter_taps(const Filter& filter, int in_size, int out_size) {
  const double scale = double(in_size) / out_size;
  // When shrinking, the kernel is stretched to cover `scale` input pixels per lobe, so that it
  // low-passes instead of aliasing.
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter.support * filter_scale;

  Taps taps;
  taps.stride = int(std::ceil(support)) * 2 + 1;
  taps.first.resize(size_t(out_size));
  taps.count.resize(size_t(out_size));
  taps.weights.assign(size_t(out_size) * size_t(taps.stride), 0);
  std::vector<double> w(size_t(taps.stride));
  for (int i = 0; i < out_size; ++i) {
    const double center = (i + 0.5) * scale;
    const int first = std::max(int(center - support + 0.5), 0);
    const int end = std::min(int(center + support + 0.5), in_size);
    const int count = end - first;
    check(count >= 1 && count <= taps.stride, "resize: bad filter window ", count,
          " for output pixel ", i);
    double total = 0.0;
    for (int k = 0; k < count; ++k) {
      w[size_t(k)] = filter.kernel((k + first - center + 0.5) * (1.0 / filter_scale));
      total += w[size_t(k)];
    }
    int32_t* out = taps.weights.data() + size_t(i) * size_t(taps.stride);
    for (int k = 0; k < count; ++k)
      out[k] = to_fixed(total != 0.0 ? w[size_t(k)] / total : w[size_t(k)]);
    taps.first[size_t(i)] = first;
    taps.count[size_t(i)] = count;
  }
  return taps;
}

uint8_t to_pixel(int64_t sum) {
  return uint8_t(std::clamp<int64_t>(sum >> kFractionBits, 0, 255));
}

// Horizontal pass over input rows [row_begin, row_end) only: the rows the vertical pass reads.
Image resample_rows(const Image& in, const Taps& taps, int width, int row_begin, int row_end) {
  Image out(width, row_end - row_begin);
  for (int y = row_begin; y < row_end; ++y) {
    const uint8_t* src = in.row(y);
    uint8_t* dst = out.row(y - row_begin);
    for (int x = 0; x < width; ++x) {
      const int32_t* k = taps.of(x);
      const uint8_t* p = src + size_t(taps.first[size_t(x)]) * 3;
      int64_t r = kHalf, g = kHalf, b = kHalf;
      for (int j = 0; j < taps.count[size_t(x)]; ++j, p += 3) {
        r += p[0] * k[j];
        g += p[1] * k[j];
        b += p[2] * k[j];
      }
      dst[3 * x + 0] = to_pixel(r);
      dst[3 * x + 1] = to_pixel(g);
      dst[3 * x + 2] = to_pixel(b);
    }
  }
  return out;
}

// Vertical pass; input row r of `in` is row r + row_offset of the original image.
Image resample_columns(const Image& in, const Taps& taps, int height, int row_offset) {
  Image out(in.width, height);
  const size_t n = in.row_bytes();
  std::vector<int64_t> sums(n);
  for (int y = 0; y < height; ++y) {
    std::fill(sums.begin(), sums.end(), kHalf);
    const int32_t* k = taps.of(y);
    for (int j = 0; j < taps.count[size_t(y)]; ++j) {
      const uint8_t* src = in.row(taps.first[size_t(y)] - row_offset + j);
      for (size_t i = 0; i < n; ++i) sums[i] += src[i] * k[j];
    }
    uint8_t* dst = out.row(y);
    for (size_t i = 0; i < n; ++i) dst[i] = to_pixel(sums[i]);
  }
  return out;
}

Image resize_with(const Filter& filter, const Image& image, int width, int height) {
  check(image.width > 0 && image.height > 0, "resize: empty input image");
  check(width > 0 && height > 0, "resize: bad output size ", width, "x", height);
  if (width == image.width && height == image.height) return image;

  const Taps vertical = filter_taps(filter, image.height, height);
  if (width == image.width) return resample_columns(image, vertical, height, 0);

  const int row_begin = vertical.first.front();
  const int row_end = vertical.first.back() + vertical.count.back();
  Image wide =
      resample_rows(image, filter_taps(filter, image.width, width), width, row_begin, row_end);
  if (height == image.height) return wide;
  return resample_columns(wide, vertical, height, row_begin);
}

}  // namespace

Image resize_lanczos(const Image& image, int width, int height) {
  return resize_with(kLanczos3, image, width, height);
}

Image resize_bilinear(const Image& image, int width, int height) {
  return resize_with(kBilinear, image, width, height);
}

}  // namespace klein
