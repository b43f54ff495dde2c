// VPDPBUSD on ymm registers (AVX-VNNI), as the AVX-VNNI tiles use it (kernels_avxvnni.cpp).
#include <immintrin.h>

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_avxvnni(int64_t rounds) {
  // Ten accumulators (latency 4-5 cycles x 2 a cycle), each round written out in one asm
  // statement: in C++ with 12 accumulators in the 16 ymm registers, GCC 12 stored most of
  // them to the stack in every round and held the loop to 150 GMAC/s a thread on Zen 5,
  // against 250-260 here (docs/SPEED.md, "Zen 5").
  constexpr int kAcc = 10;
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2),
          a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5),
          a6 = _mm256_set1_epi32(6), a7 = _mm256_set1_epi32(7), a8 = _mm256_set1_epi32(8),
          a9 = _mm256_set1_epi32(9);
  const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(-7);
  for (int64_t r = 0; r < rounds; ++r) {
#define KLEIN_DP(n) "%{vex%} vpdpbusd %[x], %[w], %" #n "\n\t"
    __asm__ volatile(KLEIN_DP(0) KLEIN_DP(1) KLEIN_DP(2) KLEIN_DP(3) KLEIN_DP(4) KLEIN_DP(5)
                         KLEIN_DP(6) KLEIN_DP(7) KLEIN_DP(8) KLEIN_DP(9)
                     : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                       "+x"(a7), "+x"(a8), "+x"(a9)
                     : [w] "x"(w), [x] "x"(x));
#undef KLEIN_DP
  }
  __m256i s =
      _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)),
                       _mm256_add_epi32(_mm256_add_epi32(a4, a5), _mm256_add_epi32(a6, a7)));
  s = _mm256_add_epi32(s, _mm256_add_epi32(a8, a9));
  volatile int sink = _mm256_extract_epi32(s, 0);
  (void)sink;
  return rounds * kAcc * 32;
}

}  // namespace klein::quant::detail
