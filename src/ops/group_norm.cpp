#include "ops/group_norm.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace klein::ops {

namespace {

// Sums of n values in a fixed order: 16 float lanes over blocks of 1024 values (so the
// compiler vectorises it), each block total added in double. A VAE group at 1024² holds
// 8M values; a plain float running sum would lose several digits.
template <class Term>
double block_sum(const float* x, int64_t n, Term term) {
  constexpr int kLanes = 16;
  constexpr int64_t kBlock = 1024;
  double total = 0;
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

float silu_value(float v) { return v / (1.0f + std::exp(-v)); }

}  // namespace

void ChannelAffine::apply(int64_t c, const float* x, float* y, int64_t n) const {
  const float m = mean[size_t(c)], s = scale[size_t(c)], b = shift[size_t(c)];
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * s + b;
  if (silu)
    for (int64_t i = 0; i < n; ++i) y[i] = silu_value(y[i]);
}

ChannelAffine group_norm_affine(const float* x, int64_t channels, int64_t pixels, int64_t groups,
                                const float* gamma, const float* beta, float eps, bool silu,
                                ThreadPool& pool) {
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
  pool.for_each_task(groups, [&](int64_t g, int) {
    const float* xg = x + g * n;
    const double mean = block_sum(xg, n, [](float v) { return v; }) / double(n);
    const float m = float(mean);
    const double var = block_sum(xg, n, [m](float v) { return (v - m) * (v - m); }) / double(n);
    const double rstd = 1.0 / std::sqrt(var + double(eps));
    for (int64_t c = g * per_group; c < (g + 1) * per_group; ++c) {
      a.mean[size_t(c)] = m;
      a.scale[size_t(c)] = float(double(gamma[c]) * rstd);
    }
  });
  return a;
}

void apply_channel_affine(const float* x, float* y, int64_t channels, int64_t pixels,
                          const ChannelAffine& a, ThreadPool& pool) {
  check(a.channels() == channels, "apply_channel_affine: statistics for ", a.channels(),
        " channels applied to ", channels);
  pool.parallel_for(channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c) a.apply(c, x + c * pixels, y + c * pixels, pixels);
  });
}

}  // namespace klein::ops
