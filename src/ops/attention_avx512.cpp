// Softmax chunks of the tiled attention with AVX-512 (compiled with -mavx512f; called only
// when the CPU has it): 16 scores per instruction and a polynomial exp instead of a libm
// call per score, which was most of the attention time with the float32 sgemm tiles.
//
// The scores are used in base 2: t = s·scale·log2(e), p = 2^(t − max t), so the scale, the
// change of base and the subtraction of the maximum are one FMA. row_max holds max t.
#include <immintrin.h>
// GCC 12's intrinsics start some conversions from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>

#include "ops/attention_kernels.h"

namespace klein::ops::detail {

namespace {

constexpr int64_t kLanes = 16;

// 2^t for finite t <= 128 (below -150 it is 0): 2^round(t) by vscalefps, which underflows
// gracefully, times kExp2Poly at f = t - round(t).
__m512 exp2_512(__m512 t) {
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int d = 1; d < 7; ++d) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[d]));
  return _mm512_scalef_ps(p, n);
}

__mmask16 lanes_below(int64_t j, int64_t end) {
  const int64_t n = end - j;
  return n >= kLanes ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Lanes of keys [j, j + 16) that row sees: below n, and not hidden by the bias.
__mmask16 shown_lanes(int64_t j, int64_t n, const float* bias) {
  __mmask16 m = lanes_below(j, n);
  if (bias && m)
    m = _mm512_mask_cmp_ps_mask(m, _mm512_maskz_loadu_ps(m, bias + j), _mm512_setzero_ps(),
                                _CMP_EQ_OQ);
  return m;
}

// Pass 1 of row i: the new running maximum of t over the chunk's visible keys and the
// correction for what was accumulated before; -inf when the row has seen nothing yet.
float update_max(const SoftmaxChunk& c, int64_t i, const float* s, int64_t n, __m512 to_t) {
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += kLanes) {
    const __mmask16 m = shown_lanes(j, n, c.bias);
    vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), to_t));
  }
  const float chunk_max = _mm512_reduce_max_ps(vmax);
  const float old_max = c.row_max[i];
  const float new_max = old_max > chunk_max ? old_max : chunk_max;
  c.correction[i] = new_max == -INFINITY ? 1.0f : exp2f(old_max - new_max);
  return new_max;
}

// Pass 2 of one row: p = 2^(t − max) for the shown keys, 0 elsewhere up to `end`; store(j,
// mask, p) writes 16 of them. Returns their sum.
template <typename Store>
float exponentiate(const SoftmaxChunk& c, const float* s, int64_t n, int64_t end, __m512 to_t,
                   float max, Store store) {
  const __m512 vmax = _mm512_set1_ps(max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < end; j += kLanes) {
    const __mmask16 shown = max == -INFINITY ? __mmask16(0) : shown_lanes(j, n, c.bias);
    __m512 p = _mm512_setzero_ps();
    if (shown) {
      p = _mm512_maskz_mov_ps(
          shown, exp2_512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(shown, s + j), to_t, vmax)));
      sum = _mm512_add_ps(sum, p);
    }
    store(j, p);
  }
  return _mm512_reduce_add_ps(sum);
}

}  // namespace

void softmax_chunk_f32_avx512(const SoftmaxChunk& c) {
  const __m512 to_t = _mm512_set1_ps(c.scale * kLog2e);
  for (int64_t i = 0; i < c.rows; ++i) {
    float* s = c.scores + i * c.ld;
    const int64_t n = c.visible(i);
    const float max = update_max(c, i, s, n, to_t);
    const float sum = exponentiate(c, s, n, c.cols, to_t, max, [&](int64_t j, __m512 p) {
      _mm512_mask_storeu_ps(s + j, lanes_below(j, c.cols), p);
    });
    if (max == -INFINITY) continue;
    c.row_sum[i] = c.row_sum[i] * c.correction[i] + sum;
    c.row_max[i] = max;
  }
}

void softmax_chunk_bf16_avx512(const SoftmaxChunk& c, uint16_t* p, int64_t ldp,
                               int64_t padded_cols) {
  const __m512 to_t = _mm512_set1_ps(c.scale * kLog2e);
  for (int64_t i = 0; i < c.rows; ++i) {
    const float* s = c.scores + i * c.ld;
    uint16_t* out = p + i * ldp;
    const int64_t n = c.visible(i);
    const float max = update_max(c, i, s, n, to_t);
    // padded_cols is a multiple of 16. The sum is of the float32 values: the bf16 rounding
    // errors are unbiased and average out over a row.
    const float sum = exponentiate(c, s, n, padded_cols, to_t, max, [&](int64_t j, __m512 v) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), __m256i(_mm512_cvtneps_pbh(v)));
    });
    if (max == -INFINITY) continue;
    c.row_sum[i] = c.row_sum[i] * c.correction[i] + sum;
    c.row_max[i] = max;
  }
}

void scale_rows_avx512(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor) {
  for (int64_t i = 0; i < rows; ++i) {
    if (factor[i] == 1.0f) continue;
    float* a = acc + i * ld;
    const __m512 f = _mm512_set1_ps(factor[i]);
    for (int64_t j = 0; j < n; j += kLanes) {
      const __mmask16 m = lanes_below(j, n);
      _mm512_mask_storeu_ps(a + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, a + j), f));
    }
  }
}

}  // namespace klein::ops::detail
