// The AVX2 Q4 tile's inner step (quant/kernels_avx2.cpp), on registers only: two VPMADDUBSW
// (low and high nibbles times their activations), VPADDW, VPMADDWD by ones, VPADDD.
#include <immintrin.h>

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_avx2(int64_t rounds) {
  constexpr int kAcc = 4;  // the products do not depend on the sums: one chain of adds each
  __m256i acc[kAcc], w[kAcc];
  for (int i = 0; i < kAcc; ++i) {
    acc[i] = _mm256_set1_epi32(i);
    w[i] = _mm256_set1_epi8(char(3 + i));
  }
  __m256i x0 = _mm256_set1_epi8(-7), x1 = _mm256_set1_epi8(11);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t r = 0; r < rounds; ++r) {
    // Every operand "changes" each round, so no product is computed once for all rounds, and
    // each accumulator has its own weights, so none is shared between accumulators.
    __asm__ volatile("" : "+x"(w[0]), "+x"(w[1]), "+x"(w[2]), "+x"(w[3]), "+x"(x0), "+x"(x1));
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) {
      const __m256i p =
          _mm256_add_epi16(_mm256_maddubs_epi16(w[i], x0), _mm256_maddubs_epi16(w[i], x1));
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(p, ones));
    }
  }
  __m256i s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_epi32(s, acc[i]);
  volatile int sink = _mm256_extract_epi32(s, 0);
  (void)sink;
  return rounds * kAcc * 64;
}

}  // namespace klein::quant::detail
