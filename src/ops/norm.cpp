#include "ops/norm.h"

#include <cmath>

#include "ops/norm_kernels.h"

namespace klein::ops {

namespace {

// The sum of f(x[i]) for i < n in double, as eight partial sums (of the indices i mod 8) added
// in a fixed order at the end: the same bits on every CPU, and eight independent chains that
// the compiler can turn into vector code (one running sum is a chain of n dependent adds,
// which made the norms 2-3 % of a klein step).
template <class F>
double sum_of(const float* x, int64_t n, F f) {
  double p[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) p[j] += f(x[i + j]);
  for (int j = 0; i < n; ++i, ++j) p[j] += f(x[i]);
  return ((p[0] + p[4]) + (p[1] + p[5])) + ((p[2] + p[6]) + (p[3] + p[7]));
}

// Statistics are accumulated in double: the references compute them in float32 with
// pairwise sums, and double keeps us within a few float32 ulps of that for any width.
// With `scale` and `shift`, each normalised value is then modulated in the same pass.
void layer_norm_rows(const float* x, float* y, int64_t rows, int64_t dim, float eps,
                     const float* scale, const float* shift, Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = x + r * dim;
      float* out = y + r * dim;
      const double mean = sum_of(in, dim, [](float v) { return double(v); }) / double(dim);
      const double sq = sum_of(in, dim, [mean](float v) {
        const double d = double(v) - mean;
        return d * d;
      });
      const float inv = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
      const float m = float(mean);
      if (!scale) {
        for (int64_t i = 0; i < dim; ++i) out[i] = (in[i] - m) * inv;
        continue;
      }
      for (int64_t i = 0; i < dim; ++i) {
        const float normed = (in[i] - m) * inv;
        out[i] = (1.0f + scale[i]) * normed + shift[i];
      }
    }
  }, 16);
}

}  // namespace

void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps, Compute& cx) {
  layer_norm_rows(x, y, rows, dim, eps, nullptr, nullptr, cx);
}

void modulated_layer_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps,
                          const float* scale, const float* shift, Compute& cx) {
  layer_norm_rows(x, y, rows, dim, eps, scale, shift, cx);
}

void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
              Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = x + r * dim;
      float* out = y + r * dim;
      const double sq = sum_of(in, dim, [](float v) { return double(v) * double(v); });
      const float inv = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
      for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * (in[i] * inv);
    }
  }, 16);
}

void silu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, const Compute& cx) {
#if defined(KLEIN_X86)
  if (cx.isa() != quant::Isa::Scalar) return detail::swiglu_avx2(gate, up, out, n);
#endif
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace klein::ops
