// The Q4 search on AVX2: the error of 8 candidates at a time (quant/blocks.h, q4_trial_errors): one
// candidate per lane, each lane doing the scalar reference's operations in its order.
// Compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an add stay two roundings.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/blocks.h"

namespace klein::quant {

void q4_trial_errors_avx2(const float* x, const float* d, const float* inv_d, const float* z,
                          int n, float* err) {
  const __m256 magic = _mm256_set1_ps(12582912.0f), fifteen = _mm256_set1_ps(15.0f),
               half = _mm256_set1_ps(0.5f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int t = 0; t < n; t += 8) {
    // The last group is padded with zero candidates (d = 1/d = z = 0), not stored.
    alignas(32) float pd[8] = {}, pinv[8] = {}, pz[8] = {}, out[8];
    const int k = std::min(8, n - t);
    std::copy(d + t, d + t + k, pd);
    std::copy(inv_d + t, inv_d + t + k, pinv);
    std::copy(z + t, z + t + k, pz);
    const __m256 vd = _mm256_load_ps(pd), vinv = _mm256_load_ps(pinv), vz = _mm256_load_ps(pz);
    __m256 e[8];
    for (auto& s : e) s = _mm256_setzero_ps();
    for (int i = 0; i < kBlock; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const __m256 xv = _mm256_set1_ps(x[i + j]);
        const __m256 v = _mm256_add_ps(_mm256_mul_ps(xv, vinv), vz);
        const __m256 a = _mm256_and_ps(v, abs_mask);
        const __m256 b = _mm256_and_ps(_mm256_sub_ps(v, fifteen), abs_mask);
        const __m256 c = _mm256_mul_ps(half, _mm256_add_ps(_mm256_sub_ps(a, b), fifteen));
        const __m256 q = _mm256_sub_ps(_mm256_add_ps(c, magic), magic);
        const __m256 r = _mm256_mul_ps(vd, _mm256_sub_ps(q, vz));
        const __m256 diff = _mm256_sub_ps(xv, r);
        e[j] = _mm256_add_ps(e[j], _mm256_mul_ps(diff, diff));
      }
    }
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(e[0], e[1]), _mm256_add_ps(e[2], e[3])),
                                     _mm256_add_ps(_mm256_add_ps(e[4], e[5]), _mm256_add_ps(e[6], e[7])));
    _mm256_store_ps(out, sum);
    std::copy(out, out + k, err + t);
  }
}

}  // namespace klein::quant

namespace klein::quant {

namespace {

// round_even(clamp(v, 0, 255)) as int32 lanes (v is never NaN here).
inline __m256i zero_code(__m256 v) {
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  return _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(v, magic), magic));
}

// Candidates of these scale and zero codes into the lists at `at` (8 of each).
struct Lists {
  alignas(32) float d[32], inv_d[32], z[32], err[32];
  alignas(32) int32_t scale[32], zero[32];
  void put(int at, __m256i code, __m256i zero_code, const Q4ScaleTable& t) {
    _mm256_store_ps(d + at, _mm256_i32gather_ps(t.d, code, 4));
    _mm256_store_ps(inv_d + at, _mm256_i32gather_ps(t.inv_d, code, 4));
    _mm256_store_ps(z + at, _mm256_div_ps(_mm256_cvtepi32_ps(zero_code), _mm256_set1_ps(16.0f)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(scale + at), code);
    _mm256_store_si256(reinterpret_cast<__m256i*>(zero + at), zero_code);
  }
};

}  // namespace

// choose_q4's steps (quant/blocks.cpp) with the candidates' set-up in lanes, their errors by
// q4_trial_errors_avx2 and the choice in the scalar's order: the scalar search's bytes.
void quantize_q4_avx2(const float* x, BlockQ4* out, int64_t n) {
  const Q4ScaleTable& table = q4_scale_table();
  alignas(32) int32_t steps_a[32], steps_ab[32], step_dc[16], step_dz[16];
  for (int t = 0; t < 32; ++t) {
    const int u = std::min(t, 24);
    steps_a[t] = u / 5;
    steps_ab[t] = u / 5 + u % 5;
  }
  for (int r = 0, k = 0; k < 15; ++k) {
    const int dc = k / 5 - 1, dz = k % 5 - 2;
    if (dc == 0 && dz == 0) continue;
    step_dc[r] = dc;
    step_dz[r] = dz;
    ++r;
  }
  step_dc[14] = step_dc[15] = step_dz[14] = step_dz[15] = 0;
  const __m256i max_code = _mm256_set1_epi32(kQ4MaxScaleCode), one = _mm256_set1_epi32(1);
  Lists lists;

  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    __m256 vlo = _mm256_loadu_ps(x), vhi = vlo;
    for (int i = 8; i < kBlock; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      vlo = _mm256_min_ps(vlo, v);
      vhi = _mm256_max_ps(vhi, v);
    }
    alignas(32) float los[8], his[8];
    _mm256_store_ps(los, vlo);
    _mm256_store_ps(his, vhi);
    const float lo = *std::min_element(los, los + 8), hi = *std::max_element(his, his + 8);
    uint8_t best_scale = 0, best_zero = 0;
    if (!(lo == 0 && hi == 0)) {
      const float span = hi > lo ? hi - lo : std::max(std::fabs(lo), std::fabs(hi));
      const float lo_base = hi > lo ? lo : std::min(lo, 0.0f);
      constexpr float kShrink = 0.03f;
      // The scale code of each width a + b = 0..8 (entries 9-15 unused).
      alignas(32) int32_t width_code[16];
      for (int k = 0; k < 2; ++k) {
        const __m256 ab = _mm256_cvtepi32_ps(_mm256_setr_epi32(8 * k, 8 * k + 1, 8 * k + 2, 8 * k + 3,
                                                                8 * k + 4, 8 * k + 5, 8 * k + 6, 8 * k + 7));
        const __m256 width = _mm256_mul_ps(
            _mm256_set1_ps(span), _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(_mm256_set1_ps(kShrink), ab)));
        const __m256 scaled =
            _mm256_div_ps(_mm256_div_ps(width, _mm256_set1_ps(15.0f)), _mm256_set1_ps(kQ4ScaleFactor));
        const __m256i h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        __m256i code = _mm256_min_epi32(_mm256_srli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(64)), 7), max_code);
        const __m256i too_big = _mm256_cmpgt_epi32(h, _mm256_set1_epi32(0x7c00 - 1));
        code = _mm256_blendv_epi8(code, max_code, too_big);
        const __m256i positive = _mm256_castps_si256(_mm256_cmp_ps(scaled, _mm256_setzero_ps(), _CMP_GT_OQ));
        code = _mm256_and_si256(code, positive);
        _mm256_store_si256(reinterpret_cast<__m256i*>(width_code + 8 * k), _mm256_max_epi32(code, one));
      }
      const __m256 step = _mm256_set1_ps(span * kShrink);
      for (int k = 0; k < 4; ++k) {
        const __m256i code = _mm256_i32gather_epi32(
            width_code, _mm256_load_si256(reinterpret_cast<const __m256i*>(steps_ab + 8 * k)), 4);
        const __m256 l = _mm256_add_ps(
            _mm256_set1_ps(lo_base),
            _mm256_mul_ps(step, _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(steps_a + 8 * k)))));
        const __m256 d = _mm256_i32gather_ps(table.d, code, 4);
        // q4_zero_for: round(clamp(-l / d * 16, 0, 255))
        const __m256 neg_l = _mm256_xor_ps(l, _mm256_set1_ps(-0.0f));
        lists.put(8 * k, code, zero_code(_mm256_mul_ps(_mm256_div_ps(neg_l, d), _mm256_set1_ps(16.0f))), table);
      }
      q4_trial_errors_avx2(x, lists.d, lists.inv_d, lists.z, 25, lists.err);
      float best_err = INFINITY;
      auto pick = [&](int count) {
        for (int i = 0; i < count; ++i)
          if (lists.err[i] < best_err) {
            best_err = lists.err[i];
            best_scale = uint8_t(lists.scale[i]);
            best_zero = uint8_t(lists.zero[i]);
          }
      };
      pick(25);

      const float centre_d = table.d[best_scale];
      const __m256 moved = _mm256_set1_ps(float(best_zero) * centre_d);
      for (int k = 0; k < 2; ++k) {
        const __m256i dc = _mm256_load_si256(reinterpret_cast<const __m256i*>(step_dc + 8 * k));
        const __m256i dz = _mm256_load_si256(reinterpret_cast<const __m256i*>(step_dz + 8 * k));
        const __m256i code =
            _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(_mm256_set1_epi32(best_scale), dc), one), max_code);
        const __m256i z0 = zero_code(_mm256_div_ps(moved, _mm256_i32gather_ps(table.d, code, 4)));
        const __m256i zero = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(z0, dz), _mm256_setzero_si256()),
                                              _mm256_set1_epi32(255));
        lists.put(8 * k, code, zero, table);
      }
      q4_trial_errors_avx2(x, lists.d, lists.inv_d, lists.z, 14, lists.err);
      pick(14);
    }
    out[b].scale = best_scale;
    out[b].zero = best_zero;
    if (!(table.d[best_scale] > 0)) {
      std::memset(out[b].q, 0, sizeof out[b].q);
      continue;
    }
    q4_levels_scalar(x, table.inv_d[best_scale], best_zero / 16.0f, out[b].q);
  }
}

}  // namespace klein::quant
