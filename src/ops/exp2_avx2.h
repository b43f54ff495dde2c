#pragma once
// 2^t on 8 lanes for the AVX2 files of ops/ (include only from files compiled with -mavx2
// -mfma; internal linkage, so no copy built for another instruction set can be linked in).
#include <immintrin.h>

#include "ops/attention_kernels.h"

namespace klein::ops::detail {
namespace {

// kExp2Poly(f) · 2^n for whole n in [-126, 127] (n + 127 is put into the exponent bits, so
// 2^n must be a normal float) and |f| about 0.5 at most.
inline __m256 exp2_parts_avx2(__m256 n, __m256 f) {
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int d = 1; d < 7; ++d) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[d]));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

}  // namespace
}  // namespace klein::ops::detail
