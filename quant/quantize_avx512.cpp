// The Q4 search's error of 16 candidates at a time (quant/blocks.h, q4_trial_errors): one
// candidate per lane, each lane doing the scalar reference's operations in its order.
// Compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an add stay two roundings.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

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

namespace klein::quant {

namespace {

// The squared errors of the 16 candidates in the lanes of (d, inv_d, z) for block x, with the
// operations of q4_trial_errors_scalar; two lists at once share the broadcasts of x.
struct Candidates {
  __m512 d, inv_d, z;
};

inline void trial_errors(const float* x, const Candidates* c, int lists, __m512* err) {
  const __m512 magic = _mm512_set1_ps(12582912.0f), fifteen = _mm512_set1_ps(15.0f),
               half = _mm512_set1_ps(0.5f);
  __m512 e[2][8];
  for (int k = 0; k < lists; ++k)
    for (auto& s : e[k]) s = _mm512_setzero_ps();
  for (int i = 0; i < kBlock; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const __m512 xv = _mm512_set1_ps(x[i + j]);
      for (int k = 0; k < lists; ++k) {
        const __m512 v = _mm512_add_ps(_mm512_mul_ps(xv, c[k].inv_d), c[k].z);
        const __m512 a = _mm512_abs_ps(v), b = _mm512_abs_ps(_mm512_sub_ps(v, fifteen));
        const __m512 h = _mm512_mul_ps(half, _mm512_add_ps(_mm512_sub_ps(a, b), fifteen));
        const __m512 q = _mm512_sub_ps(_mm512_add_ps(h, magic), magic);
        const __m512 r = _mm512_mul_ps(c[k].d, _mm512_sub_ps(q, c[k].z));
        const __m512 diff = _mm512_sub_ps(xv, r);
        e[k][j] = _mm512_add_ps(e[k][j], _mm512_mul_ps(diff, diff));
      }
    }
  }
  for (int k = 0; k < lists; ++k)
    err[k] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(e[k][0], e[k][1]), _mm512_add_ps(e[k][2], e[k][3])),
                           _mm512_add_ps(_mm512_add_ps(e[k][4], e[k][5]), _mm512_add_ps(e[k][6], e[k][7])));
}

// The candidates of the given scale codes and zero codes (int32 lanes).
inline Candidates candidates(__m512i code, __m512i zero, const Q4ScaleTable& t) {
  return {_mm512_i32gather_ps(code, t.d, 4), _mm512_i32gather_ps(code, t.inv_d, 4),
          _mm512_div_ps(_mm512_cvtepi32_ps(zero), _mm512_set1_ps(16.0f))};
}

// round_even(clamp(v, 0, 255)) as int32 lanes (v is never NaN here).
inline __m512i zero_code(__m512 v) {
  v = _mm512_min_ps(_mm512_max_ps(v, _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  return _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(v, magic), magic));
}

// The scalar search's choice among lists of candidates in order: the first with an error
// below *best_err (and below every later one). Lanes not in `valid` and NaN errors never win.
// Returns the winning lane (list * 16 + lane) or -1.
inline int first_least(const __m512* err, const __mmask16* valid, int lists, float* best_err) {
  const __m512 inf = _mm512_set1_ps(INFINITY);
  __m512 e[2];
  __m512 least = inf;
  for (int k = 0; k < lists; ++k) {
    const __mmask16 use = valid[k] & _mm512_cmp_ps_mask(err[k], err[k], _CMP_ORD_Q);
    e[k] = _mm512_mask_blend_ps(use, inf, err[k]);
    least = _mm512_min_ps(least, e[k]);
  }
  const float m = _mm512_reduce_min_ps(least);
  if (!(m < *best_err)) return -1;
  *best_err = m;
  for (int k = 0; k < lists; ++k)
    if (const __mmask16 at = _mm512_cmp_ps_mask(e[k], _mm512_set1_ps(m), _CMP_EQ_OQ))
      return k * 16 + __builtin_ctz(unsigned(at));
  return -1;
}

}  // namespace

// choose_q4's steps (quant/blocks.cpp) with the 25 range candidates in two vectors and the
// 14 refinements in one; every float operation is the scalar's, so the choice is the same.
void quantize_q4_avx512(const float* x, BlockQ4* out, int64_t n) {
  const Q4ScaleTable& table = q4_scale_table();
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // Range candidate t = 5a + b (t = 0..24, lanes 0-15 and 16-24 of two lists): a and a + b.
  alignas(64) int32_t steps_a[32], steps_ab[32];
  for (int t = 0; t < 32; ++t) {
    const int u = std::min(t, 24);
    steps_a[t] = u / 5;
    steps_ab[t] = u / 5 + u % 5;
  }
  // Refinement r (0..13): scale code step dc and zero step dz, in the scalar's order.
  alignas(64) int32_t step_dc[16], step_dz[16];
  for (int r = 0, k = 0; k < 15; ++k) {
    const int dc = k / 5 - 1, dz = k % 5 - 2;
    if (dc == 0 && dz == 0) continue;
    step_dc[r] = dc;
    step_dz[r] = dz;
    ++r;
  }
  step_dc[14] = step_dc[15] = 0;
  step_dz[14] = step_dz[15] = 0;
  const __m512i dc = _mm512_load_si512(step_dc), dz = _mm512_load_si512(step_dz);
  const __mmask16 all = 0xffff, ranges_tail = 0x01ff, refinements = 0x3fff;

  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float lo = _mm512_reduce_min_ps(_mm512_min_ps(x0, x1));
    const float hi = _mm512_reduce_max_ps(_mm512_max_ps(x0, x1));
    uint8_t best_scale = 0, best_zero = 0;
    if (!(lo == 0 && hi == 0)) {
      const float span = hi > lo ? hi - lo : std::max(std::fabs(lo), std::fabs(hi));
      const float lo_base = hi > lo ? lo : std::min(lo, 0.0f);
      constexpr float kShrink = 0.03f;
      // The scale code of each width a + b = 0..8 (lanes 9-15 unused).
      const __m512 width = _mm512_mul_ps(
          _mm512_set1_ps(span),
          _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(_mm512_set1_ps(kShrink), _mm512_cvtepi32_ps(lane))));
      const __m512 scaled = _mm512_div_ps(_mm512_div_ps(width, _mm512_set1_ps(15.0f)), _mm512_set1_ps(kQ4ScaleFactor));
      const __m512i h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      const __m512i max_code = _mm512_set1_epi32(kQ4MaxScaleCode);
      __m512i code = _mm512_min_epi32(_mm512_srli_epi32(_mm512_add_epi32(h, _mm512_set1_epi32(64)), 7), max_code);
      code = _mm512_mask_blend_epi32(_mm512_cmpge_epi32_mask(h, _mm512_set1_epi32(0x7c00)), code, max_code);
      code = _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(scaled, _mm512_setzero_ps(), _CMP_GT_OQ), code);
      const __m512i width_code = _mm512_max_epi32(code, _mm512_set1_epi32(1));

      Candidates list[2];
      __m512i codes[2], zeros[2];
      const __m512 step = _mm512_set1_ps(span * kShrink);
      for (int k = 0; k < 2; ++k) {
        codes[k] = _mm512_permutexvar_epi32(_mm512_load_si512(steps_ab + 16 * k), width_code);
        const __m512 l = _mm512_add_ps(_mm512_set1_ps(lo_base),
                                       _mm512_mul_ps(step, _mm512_cvtepi32_ps(_mm512_load_si512(steps_a + 16 * k))));
        const __m512 d = _mm512_i32gather_ps(codes[k], table.d, 4);
        // q4_zero_for: round(clamp(-l / d * 16, 0, 255))
        zeros[k] = zero_code(_mm512_mul_ps(_mm512_div_ps(_mm512_xor_ps(l, _mm512_set1_ps(-0.0f)), d), _mm512_set1_ps(16.0f)));
        list[k] = candidates(codes[k], zeros[k], table);
      }
      __m512 err[2];
      trial_errors(x, list, 2, err);
      float best_err = INFINITY;
      const __mmask16 valid[2] = {all, ranges_tail};
      alignas(64) int32_t c[32], z[32];
      if (const int w = first_least(err, valid, 2, &best_err); w >= 0) {
        _mm512_store_si512(c, codes[0]);
        _mm512_store_si512(c + 16, codes[1]);
        _mm512_store_si512(z, zeros[0]);
        _mm512_store_si512(z + 16, zeros[1]);
        best_scale = uint8_t(c[w]);
        best_zero = uint8_t(z[w]);
      }

      // Around the best range: one scale code and two zero steps either way, the zero point
      // kept in place in value space.
      const float centre_d = table.d[best_scale];
      const __m512i code_r = _mm512_min_epi32(
          _mm512_max_epi32(_mm512_add_epi32(_mm512_set1_epi32(best_scale), dc), _mm512_set1_epi32(1)), max_code);
      const __m512 d_r = _mm512_i32gather_ps(code_r, table.d, 4);
      const __m512i z0 = zero_code(_mm512_div_ps(_mm512_set1_ps(float(best_zero) * centre_d), d_r));
      const __m512i zero_r = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(z0, dz), _mm512_setzero_si512()),
                                              _mm512_set1_epi32(255));
      const Candidates around = candidates(code_r, zero_r, table);
      __m512 err_r;
      trial_errors(x, &around, 1, &err_r);
      if (const int w = first_least(&err_r, &refinements, 1, &best_err); w >= 0) {
        _mm512_store_si512(c, code_r);
        _mm512_store_si512(z, zero_r);
        best_scale = uint8_t(c[w]);
        best_zero = uint8_t(z[w]);
      }
    }
    out[b].scale = best_scale;
    out[b].zero = best_zero;
    const float d = table.d[best_scale];
    if (!(d > 0)) {
      std::memset(out[b].q, 0, sizeof out[b].q);
      continue;
    }
    q4_levels_avx512(x, table.inv_d[best_scale], best_zero / 16.0f, out[b].q);
  }
}

}  // namespace klein::quant
