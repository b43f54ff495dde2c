#pragma once
// The loop of one bf16 attention task (AmxTask), shared by the AMX tiles (attention_amx.cpp)
// and the VDPBF16PS kernel (attention_bf16_avx512.cpp): key chunks outer, 32-row query blocks
// inner, each block's scores, their online softmax with P rounded to bf16, the rescaling of
// what was accumulated and P·V; then the rows divided by their sums. The two files differ only
// in `score` and `value`. Include only from files compiled with the AVX-512 flags; internal
// linkage.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "ops/attention_kernels.h"

namespace klein::ops::detail {
namespace {

// score(queries of the block, keys, k0, padded_cols, D, scores, ld): scores [32, padded_cols).
// value(p, ldp, values, k0, padded_cols, D, acc): acc [32, D) += P · V.
template <class Score, class Value>
void attend_bf16_task(const AmxTask& t, Score score, Value value) {
  const auto min64 = [](int64_t a, int64_t b) { return a < b ? a : b; };
  const int64_t D = t.head_dim;
  const int64_t padded_rows = (t.rows + kAmxSubRows - 1) / kAmxSubRows * kAmxSubRows;
  std::memset(t.acc, 0, size_t(padded_rows * D) * sizeof(float));
  for (int64_t i = 0; i < t.rows; ++i) {
    t.row_max[i] = -INFINITY;
    t.row_sum[i] = 0;
  }
  // With a causal mask no key after the last query of the task is visible.
  const int64_t first = t.q0 + t.causal_offset;  // the position of the task's first query
  const int64_t task_end = t.causal ? min64(t.kv_len, first + t.rows) : t.kv_len;
  for (int64_t k0 = 0; k0 < task_end; k0 += t.chunk) {
    for (int64_t s0 = 0; s0 < t.rows; s0 += kAmxSubRows) {
      const int64_t sub_rows = min64(kAmxSubRows, t.rows - s0);
      const int64_t end = t.causal ? min64(task_end, first + s0 + sub_rows) : task_end;
      if (k0 >= end) continue;
      const int64_t cols = min64(t.chunk, end - k0);
      const int64_t padded_cols = (cols + kAmxKeyAlign - 1) / kAmxKeyAlign * kAmxKeyAlign;
      score(t.queries + s0 * D, t.keys, k0, padded_cols, D, t.scores, t.chunk);
      SoftmaxChunk c;
      c.scores = t.scores;
      c.ld = t.chunk;
      c.rows = sub_rows;
      c.cols = cols;
      c.scale = t.scale;
      c.bias = t.bias ? t.bias + k0 : nullptr;
      c.visible0 = t.causal ? first + s0 - k0 + 1 : cols;
      c.row_max = t.row_max + s0;
      c.row_sum = t.row_sum + s0;
      c.correction = t.correction + s0;
      softmax_chunk_bf16_avx512(c, t.p, t.chunk, padded_cols);
      if (sub_rows < kAmxSubRows)
        std::memset(t.p + sub_rows * t.chunk, 0,
                    size_t((kAmxSubRows - sub_rows) * t.chunk) * sizeof(uint16_t));
      if (k0 > 0) scale_rows_avx512(t.acc + s0 * D, D, sub_rows, D, t.correction + s0);
      value(t.p, t.chunk, t.values, k0, padded_cols, D, t.acc + s0 * D);
    }
  }
  for (int64_t i = 0; i < t.rows; ++i) {
    const float inv = t.row_sum[i] > 0 ? 1.0f / t.row_sum[i] : 0.0f;
    const __m512 f = _mm512_set1_ps(inv);
    const float* a = t.acc + i * D;
    float* o = t.out + i * t.ldo;
    for (int64_t d = 0; d < D; d += 16)
      _mm512_storeu_ps(o + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), f));
  }
}

}  // namespace
}  // namespace klein::ops::detail
