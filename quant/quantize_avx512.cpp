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

namespace klein::quant {

// quantize_q8_scalar's operations on 16 values at a time: the largest magnitude (a maximum
// is exact in any order), the f16 scale by F16C (the same rounding as f32_to_f16), then
// q = round_even(clamp(x / d, -127, 127)).
void quantize_q8_avx512(const float* x, BlockQ8* out, int64_t n) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f),
               magic = _mm512_set1_ps(12582912.0f);
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    auto to_half = [](float f) {
      return uint16_t(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
    };
    auto from_half = [](uint16_t h) {
      return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
    };
    uint16_t scale = to_half(amax / 127.0f);
    if (from_half(scale) * 127.0f < amax && scale < 0x7bff) ++scale;
    out[b].scale = scale;
    const float d = from_half(scale);
    const __m512 inv = _mm512_set1_ps(d > 0 ? 1.0f / d : 0.0f);
    auto levels = [&](__m512 v) {
      v = _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(v, inv), lo), hi);
      return _mm512_cvtepi32_epi8(
          _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, magic), magic)));
    };
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q), levels(x0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].q + 16), levels(x1));
  }
}

}  // namespace klein::quant
