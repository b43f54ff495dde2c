// The Q4 search's error of 16 candidates at a time (quant/blocks.h, q4_trial_errors): one
// candidate per lane, each lane doing the scalar reference's operations in its order.
// Compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an add stay two roundings.
#include <immintrin.h>

#include "quant/blocks.h"

namespace klein::quant {

void q4_trial_errors_avx512(const float* x, const float* d, const float* inv_d, const float* z,
                            int n, float* err) {
  const __m512 magic = _mm512_set1_ps(12582912.0f), fifteen = _mm512_set1_ps(15.0f),
               half = _mm512_set1_ps(0.5f);
  for (int t = 0; t < n; t += 16) {
    const __mmask16 m = n - t >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - t)) - 1);
    const __m512 vd = _mm512_maskz_loadu_ps(m, d + t), vinv = _mm512_maskz_loadu_ps(m, inv_d + t),
                 vz = _mm512_maskz_loadu_ps(m, z + t);
    __m512 e[8];
    for (auto& s : e) s = _mm512_setzero_ps();
    for (int i = 0; i < kBlock; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const __m512 xv = _mm512_set1_ps(x[i + j]);
        const __m512 v = _mm512_add_ps(_mm512_mul_ps(xv, vinv), vz);
        const __m512 a = _mm512_abs_ps(v), b = _mm512_abs_ps(_mm512_sub_ps(v, fifteen));
        const __m512 c = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(a, b), fifteen));
        const __m512 q = _mm512_sub_ps(_mm512_add_ps(c, magic), magic);
        const __m512 r = _mm512_mul_ps(vd, _mm512_sub_ps(q, vz));
        const __m512 diff = _mm512_sub_ps(xv, r);
        e[j] = _mm512_add_ps(e[j], _mm512_mul_ps(diff, diff));
      }
    }
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[0], e[1]), _mm512_add_ps(e[2], e[3])),
                                     _mm512_add_ps(_mm512_add_ps(e[4], e[5]), _mm512_add_ps(e[6], e[7])));
    _mm512_mask_storeu_ps(err + t, m, sum);
  }
}

}  // namespace klein::quant

namespace klein::quant {

void q4_levels_avx512(const float* x, float inv_d, float z, uint8_t* q) {
  const __m512 vinv = _mm512_set1_ps(inv_d), vz = _mm512_set1_ps(z);
  const __m512 zero = _mm512_setzero_ps(), fifteen = _mm512_set1_ps(15.0f),
               magic = _mm512_set1_ps(12582912.0f);
  auto levels = [&](const float* p) {
    __m512 v = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(p), vinv), vz);
    v = _mm512_min_ps(_mm512_max_ps(v, zero), fifteen);
    return _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, magic), magic));
  };
  const __m512i low = levels(x), high = levels(x + 16);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q),
                   _mm512_cvtepi32_epi8(_mm512_or_si512(low, _mm512_slli_epi32(high, 4))));
}

}  // namespace klein::quant
