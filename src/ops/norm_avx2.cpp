// SwiGLU's gate with AVX2 and FMA (compiled with -mavx2 -mfma; called only when the CPU has
// them): silu(g) = g / (1 + e^-g) on 8 lanes, e^-g as 2^t with t = -g·log2(e) from the
// attention softmax's polynomial (kExp2Poly, attention_kernels.h) instead of a libm call per
// value.
#include <immintrin.h>

#include "core/avx2.h"
#include "ops/attention_kernels.h"
#include "ops/exp2_avx2.h"
#include "ops/norm_kernels.h"

namespace klein::ops::detail {

namespace {

// log2(e) - kLog2e: the part of log2(e) that float32 kLog2e leaves out.
constexpr float kLog2eLow = float(1.44269504088896340736 - double(kLog2e));

__m256 silu8(__m256 g) {
  // The exponent from g limited to [-88, 87], t = -g·log2(e) in [-125.6, 127]: 2^round(t) is
  // a normal float. Above 87, 1 + e^-g is 1 in float32 either way; below -88 the result is
  // set to 0 (|g e^g| < 6e-37).
  const __m256 limited =
      _mm256_min_ps(_mm256_max_ps(g, _mm256_set1_ps(-88.0f)), _mm256_set1_ps(87.0f));
  // t in two parts, t + low: for |t| of tens, rounding t alone would put errors of ~1e-6
  // into 2^t.
  const __m256 c = _mm256_set1_ps(-kLog2e), c_low = _mm256_set1_ps(-kLog2eLow);
  const __m256 t = _mm256_mul_ps(limited, c);
  const __m256 low = _mm256_fmadd_ps(limited, c_low, _mm256_fmsub_ps(limited, c, t));
  const __m256 n = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 e = exp2_parts_avx2(n, _mm256_add_ps(_mm256_sub_ps(t, n), low));  // e^-g
  const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  return _mm256_andnot_ps(_mm256_cmp_ps(g, _mm256_set1_ps(-88.0f), _CMP_LT_OQ), silu);
}

}  // namespace

void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(silu8(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i m = lane_mask(int(n - i));
    const __m256 g = _mm256_maskload_ps(gate + i, m), u = _mm256_maskload_ps(up + i, m);
    _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(silu8(g), u));
  }
}

}  // namespace klein::ops::detail
