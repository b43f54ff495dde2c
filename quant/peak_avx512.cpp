// VPDPBUSD on zmm registers, as the AVX-512 Q8/Q4 tiles use it (quant/kernels_avx512.cpp).
#include <immintrin.h>
// GCC 12 starts _mm512_reduce_add_epi32 from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_avx512(int64_t rounds) {
  constexpr int kAcc = 16;  // latency 4-5 cycles x up to 2 per cycle, with room
  __m512i acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(-7);
  for (int64_t r = 0; r < rounds; ++r) {
    __asm__ volatile("" : "+v"(w), "+v"(x));
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
  }
  __m512i s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_epi32(s, acc[i]);
  volatile int sink = _mm512_reduce_add_epi32(s);
  (void)sink;
  return rounds * kAcc * 64;
}

}  // namespace klein::quant::detail
