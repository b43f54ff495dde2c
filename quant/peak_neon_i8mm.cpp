// SMMLA (the NEON tiles with I8MM, quant/kernels_neon_i8mm.cpp): a 2 x 8 by 8 x 2 product,
// 32 byte products per instruction, on registers only.
#include <arm_neon.h>

#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_neon_i8mm(int64_t rounds) {
  constexpr int kAcc = 16;
  int32x4_t acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = vdupq_n_s32(i);
  int8x16_t w = vdupq_n_s8(3), x = vdupq_n_s8(-7);
  for (int64_t r = 0; r < rounds; ++r) {
    __asm__ volatile("" : "+w"(w), "+w"(x));
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = vmmlaq_s32(acc[i], w, x);
  }
  int32x4_t s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = vaddq_s32(s, acc[i]);
  volatile int sink = vaddvq_s32(s);
  (void)sink;
  return rounds * kAcc * 32;
}

}  // namespace klein::quant::detail
