// The Q4 search's error of 8 candidates at a time (quant/blocks.h, q4_trial_errors): one
// candidate per lane, each lane doing the scalar reference's operations in its order.
// Compiled with -ffp-contract=off (CMakeLists.txt): a multiply and an add stay two roundings.
#include <immintrin.h>

#include <algorithm>

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
