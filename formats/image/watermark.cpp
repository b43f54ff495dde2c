#include "formats/image/watermark.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

// Compiled with -ffp-contract=off (CMakeLists.txt): every product below is rounded on its own,
// as in PyWavelets' loops, so the LL values and the inverse transform match its float64
// results bit for bit (and with them the library's argmax ties and uint8 truncations).

namespace klein {

namespace {

constexpr uint8_t kFluxBits[] = {1, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 0,
                                 0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 1, 1,
                                 1, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 1, 1, 0};
static_assert(sizeof(kFluxBits) == 46);

constexpr double kScale = 36;                  // the library's scale for U
constexpr double kHaar = 0.7071067811865476;   // PyWavelets' Haar filter taps, 1/sqrt(2)
constexpr size_t kMaxBits = 1024;

// OpenCV's 8-bit BT.601 conversions (COLOR_BGR2YUV / COLOR_YUV2BGR): 14-bit fixed point,
// rounded by adding half before the arithmetic shift, saturated to 0..255.
int descale(int x) { return (x + (1 << 13)) >> 14; }
uint8_t saturate(int x) { return uint8_t(std::clamp(x, 0, 255)); }

struct Yuv {
  uint8_t y, u, v;
};
Yuv rgb_to_yuv(int r, int g, int b) {
  const int y = descale(r * 4899 + g * 9617 + b * 1868);
  return {saturate(y), saturate(descale((b - y) * 8061 + (128 << 14))),
          saturate(descale((r - y) * 14369 + (128 << 14)))};
}
void yuv_to_rgb(int y, int u, int v, uint8_t* rgb) {
  rgb[0] = saturate(y + descale((v - 128) * 18678));
  rgb[1] = saturate(y + descale((u - 128) * -6472 + (v - 128) * -9519));
  rgb[2] = saturate(y + descale((u - 128) * 33292));
}

// One 2x2 group of U: a b / c d.
struct Quad {
  double a, b, c, d;
};
// PyWavelets' dwt2 with 'haar' on one group: along the rows' axis first (pairs a/c and b/d),
// then along the columns. Returns the four bands: LL, H (vertical difference), V, D.
struct Bands {
  double ll, h, v, d;
};
Bands haar_forward(const Quad& q) {
  const double lo_l = kHaar * q.a + kHaar * q.c, hi_l = kHaar * q.a - kHaar * q.c;
  const double lo_r = kHaar * q.b + kHaar * q.d, hi_r = kHaar * q.b - kHaar * q.d;
  return {kHaar * lo_l + kHaar * lo_r, kHaar * hi_l + kHaar * hi_r,
          kHaar * lo_l - kHaar * lo_r, kHaar * hi_l - kHaar * hi_r};
}
// PyWavelets' idwt2 of (LL, (h, v, d)): along the columns first, then the rows.
Quad haar_inverse(double ll, double h, double v, double d) {
  const double lo_l = kHaar * ll + kHaar * v, lo_r = kHaar * ll - kHaar * v;
  const double hi_l = kHaar * h + kHaar * d, hi_r = kHaar * h - kHaar * d;
  return {kHaar * lo_l + kHaar * hi_l, kHaar * lo_r + kHaar * hi_r,
          kHaar * lo_l - kHaar * hi_l, kHaar * lo_r - kHaar * hi_r};
}

// Python's float // and % for a non-negative value and a positive divisor.
double py_floordiv(double x, double m) {
  const double mod = std::fmod(x, m);
  const double div = (x - mod) / m;
  double floor_div = std::floor(div);
  if (div - floor_div > 0.5) floor_div += 1.0;
  return floor_div;
}
double py_mod(double x, double m) { return std::fmod(x, m); }

// The coefficient of a 4x4 block the method uses: the largest magnitude among the 15 after
// the top-left one, the first of equals (numpy's argmax).
int largest(const std::array<double, 16>& block) {
  int best = 1;
  for (int i = 2; i < 16; ++i)
    if (std::fabs(block[i]) > std::fabs(block[best])) best = i;
  return best;
}
int read_bit(const std::array<double, 16>& block) {
  return py_mod(std::fabs(block[largest(block)]), kScale) > 0.5 * kScale ? 1 : 0;
}
double level(double v, double steps, int bit) {
  const double q = (py_floordiv(std::fabs(v), kScale) + steps + 0.25 + 0.5 * bit) * kScale;
  return v >= 0 ? q : -q;
}

// The image as planes of Y, U and V, and U's Haar bands over the marked region.
struct Planes {
  int width = 0, height = 0;
  int rows = 0, cols = 0;  // the region: each side floored to a multiple of 4
  std::vector<Yuv> yuv;
  std::vector<Bands> bands;  // [rows / 2, cols / 2]

  explicit Planes(const Image& image)
      : width(image.width), height(image.height), rows(image.height / 4 * 4),
        cols(image.width / 4 * 4) {
    yuv.resize(size_t(width) * size_t(height));
    for (int y = 0; y < height; ++y)
      for (int x = 0; x < width; ++x) {
        const uint8_t* p = image.pixel(x, y);
        yuv[size_t(y) * size_t(width) + size_t(x)] = rgb_to_yuv(p[0], p[1], p[2]);
      }
    bands.resize(size_t(rows / 2) * size_t(cols / 2));
    for (int i = 0; i < rows / 2; ++i)
      for (int j = 0; j < cols / 2; ++j) bands[size_t(i) * size_t(cols / 2) + size_t(j)] =
          haar_forward(quad(2 * i, 2 * j));
  }
  Quad quad(int y, int x) const {
    auto u = [&](int yy, int xx) { return double(yuv[size_t(yy) * size_t(width) + size_t(xx)].u); };
    return {u(y, x), u(y, x + 1), u(y + 1, x), u(y + 1, x + 1)};
  }
  Bands& band(int i, int j) { return bands[size_t(i) * size_t(cols / 2) + size_t(j)]; }
  int block_rows() const { return rows / 2 / 4; }
  int block_cols() const { return cols / 2 / 4; }
  std::array<double, 16> block(int bi, int bj) {
    std::array<double, 16> b{};
    for (int r = 0; r < 4; ++r)
      for (int c = 0; c < 4; ++c) b[size_t(r * 4 + c)] = band(4 * bi + r, 4 * bj + c).ll;
    return b;
  }
};

// The U value the library stores for a reconstructed float (numpy's uint8 cast truncates;
// out of range it wraps, here it is clamped).
uint8_t store_u(double u) { return uint8_t(std::clamp(std::trunc(u), 0.0, 255.0)); }

// The 2x2 group of pixels at LL (i, j) after reconstruction with LL value `ll`, with the
// library's exchange of the horizontal and vertical details: RGB, then U as the decoder
// sees it again.
struct Group {
  std::array<uint8_t, 12> rgb;
  Quad u_again;
};
Group reconstruct(const Planes& p, const Bands& b, double ll, int i, int j) {
  const Quad q = haar_inverse(ll, b.v, b.h, b.d);
  const double us[4] = {q.a, q.b, q.c, q.d};
  Group g{};
  double again[4];
  for (int k = 0; k < 4; ++k) {
    const int y = 2 * i + k / 2, x = 2 * j + k % 2;
    const Yuv& o = p.yuv[size_t(y) * size_t(p.width) + size_t(x)];
    uint8_t* rgb = g.rgb.data() + 3 * k;
    yuv_to_rgb(o.y, store_u(us[k]), o.v, rgb);
    again[k] = rgb_to_yuv(rgb[0], rgb[1], rgb[2]).u;
  }
  g.u_again = {again[0], again[1], again[2], again[3]};
  return g;
}

// The bit the decoder reads from block (bi, bj) when its LL values are `block`: every group
// reconstructed, converted to RGB and back.
int read_back(const Planes& p, int bi, int bj, const std::array<double, 16>& block) {
  std::array<double, 16> again{};
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      const int i = 4 * bi + r, j = 4 * bj + c;
      const Bands& b = p.bands[size_t(i) * size_t(p.cols / 2) + size_t(j)];
      again[size_t(r * 4 + c)] = haar_forward(reconstruct(p, b, block[size_t(r * 4 + c)], i, j).u_again).ll;
    }
  return read_bit(again);
}

// Embeds `bit` in block (bi, bj) by setting its LL values; returns false when no candidate
// reads back right (the library's own choice is kept then).
bool embed_block(Planes& p, int bi, int bj, int bit, bool& corrected) {
  const std::array<double, 16> original = p.block(bi, bj);
  const int first = largest(original);
  std::array<double, 16> block = original;
  block[size_t(first)] = level(original[size_t(first)], 0, bit);
  corrected = false;
  bool ok = read_back(p, bi, bj, block) == bit;
  if (!ok) {
    // Other levels of the largest coefficient, and levels of the next two largest, nearest
    // first.
    std::array<int, 15> order{};
    for (int i = 0; i < 15; ++i) order[size_t(i)] = i + 1;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return std::fabs(original[size_t(a)]) > std::fabs(original[size_t(b)]);
    });
    struct Candidate {
      int index;
      double value, cost;
    };
    std::vector<Candidate> candidates;
    for (int n = 0; n < 3; ++n)
      for (double steps : {0.0, 1.0, -1.0, 2.0, -2.0}) {
        const int index = order[size_t(n)];
        if (index == first && steps == 0) continue;
        const double v = level(original[size_t(index)], steps, bit);
        if (std::fabs(v) > 510) continue;  // beyond the LL range of 8-bit values
        if (v * (original[size_t(index)] >= 0 ? 1 : -1) < 0) continue;
        candidates.push_back({index, v, std::fabs(v - original[size_t(index)])});
      }
    std::stable_sort(candidates.begin(), candidates.end(),
                     [](const Candidate& a, const Candidate& b) { return a.cost < b.cost; });
    for (const Candidate& c : candidates) {
      std::array<double, 16> trial = original;
      trial[size_t(c.index)] = c.value;
      if (read_back(p, bi, bj, trial) == bit) {
        block = trial;
        ok = corrected = true;
        break;
      }
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) p.band(4 * bi + r, 4 * bj + c).ll = block[size_t(r * 4 + c)];
  return ok;
}

void check_fits(const Image& image) {
  check(watermark_fits(image.width, image.height), "watermark: a ", image.width, "x",
        image.height, " image is too small to carry the mark (the dwtDct method needs at least ",
        kWatermarkMinPixels, " pixels, e.g. 256x256, and 8 on each side)");
}

}  // namespace

std::span<const uint8_t> flux_watermark_bits() { return kFluxBits; }

std::string bits_text(std::span<const uint8_t> bits) {
  std::string s;
  for (uint8_t b : bits) s += b ? '1' : '0';
  return s;
}

bool watermark_fits(int64_t width, int64_t height) {
  return width >= 8 && height >= 8 && width * height >= kWatermarkMinPixels;
}

WatermarkStats embed_watermark(Image& image, std::span<const uint8_t> bits) {
  check_fits(image);
  check(!bits.empty() && bits.size() <= kMaxBits, "watermark: the message has ", bits.size(),
        " bits (1 to ", kMaxBits, " are possible)");
  for (uint8_t b : bits) check(b <= 1, "watermark: a message bit is ", int(b), ", not 0 or 1");
  Planes p(image);
  WatermarkStats stats;
  for (int bi = 0; bi < p.block_rows(); ++bi)
    for (int bj = 0; bj < p.block_cols(); ++bj) {
      bool corrected = false;
      const bool ok = embed_block(p, bi, bj, bits[size_t(stats.blocks) % bits.size()], corrected);
      stats.corrected += corrected;
      stats.unreadable += !ok;
      ++stats.blocks;
    }
  // The whole image goes back through YUV (as the library's conversion of every pixel does);
  // the region's U from the marked bands.
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) {
      const Yuv& o = p.yuv[size_t(y) * size_t(p.width) + size_t(x)];
      yuv_to_rgb(o.y, o.u, o.v, image.pixel(x, y));
    }
  for (int i = 0; i < p.rows / 2; ++i)
    for (int j = 0; j < p.cols / 2; ++j) {
      const Bands& b = p.band(i, j);
      const Group g = reconstruct(p, b, b.ll, i, j);
      for (int k = 0; k < 4; ++k)
        std::copy_n(g.rgb.data() + 3 * k, 3, image.pixel(2 * j + k % 2, 2 * i + k / 2));
    }
  return stats;
}

WatermarkReading read_watermark(const Image& image, size_t n) {
  check_fits(image);
  check(n >= 1 && n <= kMaxBits, "watermark: cannot read a ", n, "-bit message (1 to ",
        kMaxBits, " bits)");
  Planes p(image);
  WatermarkReading r;
  r.ones.assign(n, 0);
  r.votes.assign(n, 0);
  for (int bi = 0; bi < p.block_rows(); ++bi)
    for (int bj = 0; bj < p.block_cols(); ++bj) {
      const size_t k = size_t(r.blocks++) % n;
      r.ones[k] += read_bit(p.block(bi, bj));
      ++r.votes[k];
    }
  r.bits.resize(n);
  // The library: the mean of the block scores, times 255, above 127 (no blocks: 0).
  for (size_t k = 0; k < n; ++k)
    r.bits[k] = r.votes[k] && double(r.ones[k]) / double(r.votes[k]) * 255.0 > 127.0;
  return r;
}

}  // namespace klein
