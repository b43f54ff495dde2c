#pragma once
// Normalisations and activations over rows of float32 activations.
#include <cstdint>

#include "ops/compute.h"

namespace klein::ops {

// LayerNorm without affine parameters, biased variance: (x - mean) / sqrt(var + eps).
void layer_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps, Compute& cx);
// adaLN: (1 + scale) ⊙ layer_norm(x) + shift in one pass over the rows (scale and shift `dim`
// wide, the same for every row); the same roundings as layer_norm and then the modulation.
void modulated_layer_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps,
                          const float* scale, const float* shift, Compute& cx);
// RMSNorm: w ⊙ x / sqrt(mean(x²) + eps), statistics in double.
// `dim` is the normalised width; rows are contiguous (row r at x + r * dim).
void rms_norm(const float* x, float* y, int64_t rows, int64_t dim, const float* weight,
              float eps, Compute& cx);
// x ← x · sigmoid(x)
void silu_inplace(float* x, int64_t n);
// out[i] = silu(gate[i]) · up[i] (out may be gate or up). Vectorised on x86 (AVX2, also on
// AVX-512 CPUs) with a polynomial exp within a few float32 ulps of libm's; scalar with libm
// under KLEIN_ISA=scalar and on ARM.
void swiglu(const float* gate, const float* up, float* out, int64_t n, const Compute& cx);

}  // namespace klein::ops
