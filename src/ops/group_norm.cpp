#include "ops/group_norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "ops/group_norm_kernels.h"

namespace klein::ops {

namespace {

constexpr int64_t kBlock = 1024;
// Values a group's statistics read at a time when they come through a GroupReader: a multiple
// of kBlock, so the sums below are the same as over the whole group at once.
constexpr int64_t kChunk = 256 * kBlock;

// Sums of n values in a fixed order: 16 float lanes over blocks of 1024 values (so the
// compiler vectorises it), each block total added in double to `total`. A VAE group at 1024²
// holds 8M values; a plain float running sum would lose several digits. Summing a group in
// pieces that start on block boundaries, carrying the total, gives the same result.
template <class Term>
double block_sum(const float* x, int64_t n, Term term, double total = 0) {
  constexpr int kLanes = 16;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    float lane[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += term(x[i + l]);
    double block = 0;
    for (; i < end; ++i) block += term(x[i]);
    for (int l = 0; l < kLanes; ++l) block += lane[l];
    total += block;
  }
  return total;
}

}  // namespace

namespace detail {

AffineKernel affine_kernel_baseline() { return &affine_rows; }

AffineKernel affine_kernel(quant::Isa isa) {
  switch (isa) {
#if defined(KLEIN_X86)
    case quant::Isa::Avx512:
    case quant::Isa::Amx: return affine_kernel_avx512();
    case quant::Isa::Avx2: return affine_kernel_avx2();
#endif
    default: return affine_kernel_baseline();
  }
}

}  // namespace detail

void ChannelAffine::apply(int64_t c, const float* x, float* y, int64_t n) const {
  // The widest copy this CPU runs (KLEIN_ISA); every copy gives the same bits.
  static const detail::AffineKernel kernel = detail::affine_kernel(quant::best_isa());
  kernel(mean[size_t(c)], scale[size_t(c)], shift[size_t(c)], silu, x, y, n);
}

ChannelAffine group_norm_affine(const float* x, int64_t channels, int64_t pixels, int64_t groups,
                                const float* gamma, const float* beta, float eps, bool silu,
                                Compute& cx) {
  const int64_t n = channels / std::max<int64_t>(groups, 1) * pixels;
  return group_norm_affine(
      [x, n](int64_t g, int64_t offset, int64_t, float*) { return x + g * n + offset; }, channels,
      pixels, groups, gamma, beta, eps, silu, cx);
}

ChannelAffine group_norm_affine(const GroupReader& read, int64_t channels, int64_t pixels,
                                int64_t groups, const float* gamma, const float* beta, float eps,
                                bool silu, Compute& cx) {
  check(groups > 0 && channels % groups == 0, "group_norm: ", channels,
        " channels cannot be split into ", groups, " groups");
  const int64_t per_group = channels / groups;
  const int64_t n = per_group * pixels;  // a group's channels are contiguous in [C, H·W]
  ChannelAffine a;
  a.mean.resize(size_t(channels));
  a.scale.resize(size_t(channels));
  a.shift.assign(beta, beta + channels);
  a.silu = silu;
  // Two passes (mean, then squared deviations): robust when |mean| >> std.
  cx.pool().for_each_task(groups, [&](int64_t g, int) {
    std::vector<float> buffer;
    auto sum = [&](auto term) {
      double total = 0;
      for (int64_t offset = 0; offset < n; offset += kChunk) {
        const int64_t len = std::min(kChunk, n - offset);
        if (buffer.size() < size_t(len)) buffer.resize(size_t(len));
        total = block_sum(read(g, offset, len, buffer.data()), len, term, total);
      }
      return total;
    };
    const double mean = sum([](float v) { return v; }) / double(n);
    const float m = float(mean);
    const double var = sum([m](float v) { return (v - m) * (v - m); }) / double(n);
    const double rstd = 1.0 / std::sqrt(var + double(eps));
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      a.mean[size_t(c)] = m;
      a.scale[size_t(c)] = float(double(gamma[c]) * rstd);
    }
  });
  return a;
}

void apply_channel_affine(const float* x, float* y, int64_t channels, int64_t pixels,
                          const ChannelAffine& a, Compute& cx) {
  check(a.channels() == channels, "apply_channel_affine: statistics for ", a.channels(),
        " channels applied to ", channels);
  cx.pool().parallel_for(channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) a.apply(c, x + c * pixels, y + c * pixels, pixels);
  });
}

}  // namespace klein::ops
