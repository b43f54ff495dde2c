// SDOT (the NEON tiles without I8MM, quant/kernels_neon.cpp) on registers only.
#include <arm_neon.h>

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_neon(int64_t rounds) {
  constexpr int kAcc = 16;
  int32x4_t acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = vdupq_n_s32(i);
  int8x16_t w = vdupq_n_s8(3), x = vdupq_n_s8(-7);
  for (int64_t r = 0; r < rounds; ++r) {
    __asm__ volatile("" : "+w"(w), "+w"(x));
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = vdotq_s32(acc[i], w, x);
  }
  int32x4_t s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = vaddq_s32(s, acc[i]);
  volatile int sink = vaddvq_s32(s);
  (void)sink;
  return rounds * kAcc * 16;
}

}  // namespace klein::quant::detail
