// VPDPBUSD on ymm registers (AVX-VNNI), as the AVX-VNNI tiles use it (kernels_avxvnni.cpp).
#include <immintrin.h>

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_avxvnni(int64_t rounds) {
  constexpr int kAcc = 12;  // latency 4-5 cycles x 2 per cycle, with room; 14 of 16 registers
  __m256i acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_epi32(i);
  __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-7);
  for (int64_t r = 0; r < rounds; ++r) {
    __asm__ volatile("" : "+x"(w), "+x"(x));
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_dpbusd_avx_epi32(acc[i], w, x);
  }
  __m256i s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_epi32(s, acc[i]);
  volatile int sink = _mm256_extract_epi32(s, 0);
  (void)sink;
  return rounds * kAcc * 32;
}

}  // namespace klein::quant::detail
