#include "ops/low_rank.h"

#include <cblas.h>

#include <algorithm>

#include "ops/blas.h"
#include "ops/gemm.h"

namespace klein::ops {

void add_low_rank(const float* x, int64_t M, int64_t ldx, const float* down, const float* up,
                  int64_t N, int64_t K, int64_t rank, float scale, float* y, int64_t ldy,
                  Compute& cx) {
  if (M == 0 || N == 0) return;
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (M + kChunk - 1) / kChunk;
  cx.pool().for_each_task(chunks, [&](int64_t c, int worker) {
    const int64_t m0 = c * kChunk, rows = std::min(kChunk, M - m0);
    Arena::Scope scratch(cx.arena(worker));
    float* t = scratch.take<float>(size_t(rows * rank));
    float* pack = scratch.take<float>(gemm_pack_floats());
    // t = x · downᵀ                                                           [rows, r]
    gemm({.M = rows, .N = rank, .K = K, .a = x + m0 * ldx, .lda = ldx, .b = down, .ldb = K,
          .b_transposed = true, .c = t, .ldc = rank},
         cx.isa(), pack);
    // y += scale · t · upᵀ                                                      [rows, N]
    gemm({.M = rows, .N = N, .K = rank, .a = t, .lda = rank, .b = up, .ldb = rank,
          .b_transposed = true, .c = y + m0 * ldy, .ldc = ldy, .alpha = scale,
          .accumulate = true},
         cx.isa(), pack);
  });
}

void merge_low_rank(const float* down, const float* up, int64_t N, int64_t K, int64_t rank,
                    float scale, float* w) {
  ensure_blas_single_threaded();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(N), int(K), int(rank), scale, up,
              int(rank), down, int(K), 1.0f, w, int(K));
}

}  // namespace klein::ops
