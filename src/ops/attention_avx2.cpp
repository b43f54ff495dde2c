// Softmax chunks of the tiled attention with AVX2 and FMA (compiled with -mavx2 -mfma; called
// only when the CPU has them): 8 scores per instruction and a polynomial exp instead of a
// libm call per score, as attention_avx512.cpp does with 16.
//
// Scores in base 2 as there: t = s·scale·log2(e), p = 2^(t − max t), one FMA for the scale,
// the change of base and the subtraction of the maximum. row_max holds max t.
#include <immintrin.h>

#include <cmath>

#include "core/avx2.h"
#include "ops/attention_kernels.h"
#include "ops/exp2_avx2.h"

namespace klein::ops::detail {

namespace {

constexpr int64_t kLanes = 8;

// 2^t for t <= 128: kExp2Poly at f = t - round(t) times 2^round(t) put into the exponent
// bits. Without vscalefps, t is clamped at -126 first, so that 2^round(t) stays a normal
// number: a probability below 2^-126 comes out as at most 2^-126 instead of less, far below
// what a sum of at least 1 can resolve.
__m256 exp2_256(__m256 t) {
  t = _mm256_max_ps(t, _mm256_set1_ps(-126.0f));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return exp2_parts_avx2(n, _mm256_sub_ps(t, n));
}

// All ones in the lanes of keys [j, j + 8) below `end`.
__m256i lanes_below(int64_t j, int64_t end) {
  const int64_t n = end - j;
  return lane_mask(n >= kLanes ? int(kLanes) : n <= 0 ? 0 : int(n));
}

// Lanes of keys [j, j + 8) that the row sees: below n, and not hidden by the bias.
__m256 shown_lanes(int64_t j, int64_t n, const float* bias) {
  __m256 m = _mm256_castsi256_ps(lanes_below(j, n));
  if (bias)
    m = _mm256_and_ps(m, _mm256_cmp_ps(_mm256_maskload_ps(bias + j, _mm256_castps_si256(m)),
                                       _mm256_setzero_ps(), _CMP_EQ_OQ));
  return m;
}

// Pass 1 of row i: the new running maximum of t over the chunk's visible keys and the
// correction for what was accumulated before; -inf when the row has seen nothing yet.
float update_max(const SoftmaxChunk& c, int64_t i, const float* s, int64_t n, __m256 to_t) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 vmax = neg_inf;
  for (int64_t j = 0; j < n; j += kLanes) {
    const __m256 m = shown_lanes(j, n, c.bias);
    const __m256 t = _mm256_mul_ps(_mm256_maskload_ps(s + j, _mm256_castps_si256(m)), to_t);
    vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(neg_inf, t, m));
  }
  const float chunk_max = hmax(vmax);
  const float old_max = c.row_max[i];
  const float new_max = old_max > chunk_max ? old_max : chunk_max;
  c.correction[i] = new_max == -INFINITY ? 1.0f : exp2f(old_max - new_max);
  return new_max;
}

}  // namespace

void softmax_chunk_f32_avx2(const SoftmaxChunk& c) {
  const __m256 to_t = _mm256_set1_ps(c.scale * kLog2e);
  for (int64_t i = 0; i < c.rows; ++i) {
    float* s = c.scores + i * c.ld;
    const int64_t n = c.visible(i);
    const float max = update_max(c, i, s, n, to_t);
    const __m256 vmax = _mm256_set1_ps(max);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < c.cols; j += kLanes) {
      __m256 p = _mm256_setzero_ps();
      if (max != -INFINITY) {
        const __m256 shown = shown_lanes(j, n, c.bias);
        const __m256 x = _mm256_maskload_ps(s + j, _mm256_castps_si256(shown));
        p = _mm256_and_ps(shown, exp2_256(_mm256_fmsub_ps(x, to_t, vmax)));
        sum = _mm256_add_ps(sum, p);
      }
      _mm256_maskstore_ps(s + j, lanes_below(j, c.cols), p);
    }
    if (max == -INFINITY) continue;
    c.row_sum[i] = c.row_sum[i] * c.correction[i] + hsum(sum);
    c.row_max[i] = max;
  }
}

void scale_rows_avx2(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor) {
  for (int64_t i = 0; i < rows; ++i) {
    if (factor[i] == 1.0f) continue;
    float* a = acc + i * ld;
    const __m256 f = _mm256_set1_ps(factor[i]);
    int64_t d = 0;
    for (; d + kLanes <= n; d += kLanes)
      _mm256_storeu_ps(a + d, _mm256_mul_ps(_mm256_loadu_ps(a + d), f));
    for (; d < n; ++d) a[d] *= factor[i];
  }
}

}  // namespace klein::ops::detail
