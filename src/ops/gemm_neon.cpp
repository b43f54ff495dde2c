// The NEON kernel of gemm.cpp: 8 rows x 8 columns, 16 accumulators of 4 floats.
#include <arm_neon.h>

#include "ops/gemm_kernels.h"

namespace klein::ops::detail {

namespace {

struct Neon {
  using Reg = float32x4_t;
  static Reg load(const float* p) { return vld1q_f32(p); }
  static Reg splat(const float* p) { return vld1q_dup_f32(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return vfmaq_f32(c, a, b); }
  static void store(float* p, Reg r) { vst1q_f32(p, r); }
};

}  // namespace

GemmKernel gemm_kernel_neon() { return make_gemm_kernel<Neon, 8>(); }

}  // namespace klein::ops::detail
