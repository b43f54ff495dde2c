#pragma once
// Internal to attention.cpp: the softmax and tile kernels per instruction set. attention.cpp
// owns the threads, the scratch memory and the choice of path; these only compute.
#include <cstdint>

namespace klein::ops::detail {

// One chunk of keys [k0, k0 + cols) of an online softmax over a block of query rows.
// Row i of `scores` holds the unscaled dot products q_i·k_j; key j of the chunk is visible
// to row i when j < visible0 + i (clamped to [0, cols]) and, with a bias, bias[j] == 0
// (-inf hides it). row_max and row_sum carry the running maximum of the scaled scores (in
// units of the kernel's choosing: natural for the scalar kernel, base 2 for AVX-512; one
// kernel per call) and the sum of exp(score − row_max) over the chunks seen so far;
// correction[i] receives the factor by which what row i accumulated before this chunk must
// be multiplied (1 when the maximum did not move). A row that has seen no visible key yet
// keeps row_max = -inf, row_sum = 0 and gets probabilities 0.
struct SoftmaxChunk {
  float* scores = nullptr;  // [rows, ld]
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float scale = 1;
  const float* bias = nullptr;  // [cols] or null
  int64_t visible0 = 0;         // cols (or more) when nothing is causal
  float* row_max = nullptr;
  float* row_sum = nullptr;
  float* correction = nullptr;
};

// exp(scale·s − max) written over the scores in float32 (zero for hidden keys).
void softmax_chunk_f32_scalar(const SoftmaxChunk& c);
#if defined(KLEIN_X86)
void softmax_chunk_f32_avx512(const SoftmaxChunk& c);
// acc[i, 0:n) *= factor[i] for each of `rows` rows with factor != 1.
void scale_rows_avx512(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor);
#endif

}  // namespace klein::ops::detail
