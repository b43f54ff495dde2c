#pragma once
// Low-rank updates of a linear layer (LoRA): y += s · (x · Aᵀ) · Bᵀ beside y = x · Wᵀ, and the
// same update merged into a float32 weight, W += s · B · A.
#include <cstdint>

#include "ops/compute.h"

namespace klein::ops {

// y[m, n] += scale · Σ_j up[n, j] · Σ_k down[j, k] · x[m, k]
//   x [M, K] rows ldx apart, down [r, K], up [N, r], y [M, N] rows ldy apart.
// The rank-r intermediate lives in the worker's arena, rows in chunks across the pool.
void add_low_rank(const float* x, int64_t M, int64_t ldx, const float* down, const float* up,
                  int64_t N, int64_t K, int64_t rank, float scale, float* y, int64_t ldy,
                  Compute& cx);

// w[n, k] += scale · Σ_j up[n, j] · down[j, k] for a [N, K] float32 weight.
void merge_low_rank(const float* down, const float* up, int64_t N, int64_t K, int64_t rank,
                    float scale, float* w);

}  // namespace klein::ops
