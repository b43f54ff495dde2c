// The NEON transforms of conv2d_winograd.cpp: 4 tiles per group, in order (vld4q / vst4q).
#include <arm_neon.h>

#include "ops/winograd_kernels.h"

namespace klein::ops::detail {

namespace {

struct Neon {
  using Reg = float32x4_t;
  static Reg load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Reg r) { vst1q_f32(p, r); }
  static Reg add(Reg a, Reg b) { return vaddq_f32(a, b); }
  static Reg sub(Reg a, Reg b) { return vsubq_f32(a, b); }
  static Reg mul(Reg a, Reg b) { return vmulq_f32(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return vfmaq_f32(c, a, b); }
  static Reg set(float x) { return vdupq_n_f32(x); }
  static void load4(const float* p, Reg r[4]) {
    const float32x4x4_t v = vld4q_f32(p);
    for (int e = 0; e < 4; ++e) r[e] = v.val[e];
  }
  static void store4(float* p, const Reg r[4]) { vst4q_f32(p, (float32x4x4_t{{r[0], r[1], r[2], r[3]}})); }
};

}  // namespace

WinogradKernels winograd_kernels_neon() { return Winograd<Neon>::kernels(); }

}  // namespace klein::ops::detail
