#pragma once
// Our own float32 matrix multiply, for the float parts of the generation path (attention's
// Q·Kᵀ and P·V, projections with float weights, the LoRA side path, the VAE's convolutions as
// im2col products), so that their speed is ours on every CPU rather than what a BLAS
// library guesses about it.
//
//   C = alpha · A · op(B)  (+ C when accumulate)
//   A [M, K] row-major (row stride lda); op(B) = B [K, N] (row stride ldb), or Bᵀ for
//   B [N, K] when b_transposed; C [M, N] row-major (ldc). Without accumulate, C is written
//   and never read (it may hold anything).
//
// One call runs on the calling thread: the callers split the work among the pool's workers,
// as they did with BLAS. Each call needs a packing buffer of gemm_pack_floats() floats (from
// the caller's arena: nothing is allocated here).
//
// The method is the usual one: op(B) is packed, KC rows by NC columns at a time, into panels
// NR columns wide, and a register-blocked micro-kernel multiplies MR rows of A with one panel,
// broadcasting A's values and keeping the MR x NR sums in registers (AVX-512: 12 x 32,
// AVX2: 6 x 16, NEON: 8 x 8, scalar: 4 x 8). Each sum runs over k in order with fused
// multiply-adds; a K longer than KC adds its blocks in order.
#include <cstddef>
#include <cstdint>

#include "quant/matmul.h"

namespace klein::ops {

struct GemmArgs {
  int64_t M = 0, N = 0, K = 0;
  const float* a = nullptr;
  int64_t lda = 0;
  const float* b = nullptr;
  int64_t ldb = 0;
  bool b_transposed = false;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1;
  bool accumulate = false;
  // A as gemm_pack_a packed it (then a and lda are not read): for an A that many calls
  // share, such as a convolution's weights across its pixel tiles. A call can take rows
  // [a_packed_row0, a_packed_row0 + M) of a packed A of a_packed_rows rows (0: M), row0 a
  // multiple of gemm_row_block(isa): the same sums, bit for bit, as those rows of one call.
  const float* a_packed = nullptr;
  int64_t a_packed_row0 = 0;
  int64_t a_packed_rows = 0;
};

// Floats of packing buffer one gemm call needs (the same for every shape).
size_t gemm_pack_floats();

// C = alpha·A·op(B) (+ C) with the kernels of `isa` (Scalar, Avx2, Avx512/Amx or Neon).
void gemm(const GemmArgs& g, quant::Isa isa, float* pack);

// A [M, K] (row stride lda) packed once for every gemm of `isa` that multiplies it
// (GemmArgs::a_packed): gemm_packed_a_floats(M, K, isa) floats.
size_t gemm_packed_a_floats(int64_t M, int64_t K, quant::Isa isa);
void gemm_pack_a(const float* a, int64_t lda, int64_t M, int64_t K, quant::Isa isa, float* out);
// Rows [i0, i0 + rows) of that A, given as rows [rows, K] (row stride lda), packed into their
// place in `out` (the buffer of all M rows): i0 a multiple of gemm_row_block(isa), so that
// blocks of rows can be packed apart (by different threads). The same bytes as gemm_pack_a.
void gemm_pack_a_rows(const float* rows, int64_t lda, int64_t i0, int64_t count, int64_t M,
                      int64_t K, quant::Isa isa, float* out);
// The rows of A the kernel of `isa` multiplies at once (MR).
int64_t gemm_row_block(quant::Isa isa);

}  // namespace klein::ops
