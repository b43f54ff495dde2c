#include "ops/norm.h"

#include <cmath>

#include "ops/norm_kernels.h"

namespace klein::ops {

// Statistics are accumulated in double: the references compute them in float32 with
// pairwise sums, and double keeps us within a few float32 ulps of that for any width.
void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps, Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = x + r * dim;
      float* out = y + r * dim;
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < dim; ++i) sum += in[i];
      const double mean = sum / double(dim);
      for (int64_t i = 0; i < dim; ++i) {
        const double d = in[i] - mean;
        sq += d * d;
      }
      const float inv = float(1.0 / std::sqrt(sq / double(dim) + double(eps)));
      const float m = float(mean);
      for (int64_t i = 0; i < dim; ++i) out[i] = (in[i] - m) * inv;
    }
  }, 16);
}

void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight, float eps,
              Compute& cx) {
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = x + r * dim;
      float* out = y + r * dim;
      double sq = 0;
      for (int64_t i = 0; i < dim; ++i) sq += double(in[i]) * in[i];
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
