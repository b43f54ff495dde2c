#pragma once
// Pieces the NEON kernel files (kernels_neon.cpp, kernels_neon_i8mm.cpp) share; internal
// linkage, as in kernel_common.h, so each file keeps the copy built with its own flags.
#include <arm_neon.h>

namespace klein::quant::detail {
namespace {

// Writes (or adds to) the first `cols` (0..4) of 4 outputs.
inline void store4(float* y, float32x4_t v, int cols, bool accumulate) {
  if (cols >= 4) {
    if (accumulate) v = vaddq_f32(v, vld1q_f32(y));
    vst1q_f32(y, v);
    return;
  }
  float tmp[4];
  vst1q_f32(tmp, v);
  for (int i = 0; i < cols; ++i) y[i] = (accumulate ? y[i] : 0.0f) + tmp[i];
}

}  // namespace
}  // namespace klein::quant::detail
