#pragma once
// Pieces the NEON kernel files (kernels_neon.cpp, kernels_neon_i8mm.cpp) share; internal
// linkage, as in kernel_common.h, so each file keeps the copy built with its own flags.
#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "quant/blocks.h"

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

// The scales d of tile rows 4 quad .. 4 quad + 3 of a Q4 tile, and d times their zero points
// (the term that the activations' scaled sums multiply).
struct Q4Scales {
  float32x4_t d, dz;
};
inline Q4Scales q4_scales(const TileQ4& t, int quad) {
  uint32_t packed;
  std::memcpy(&packed, t.scale + 4 * quad, 4);
  const uint16x4_t codes = vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(packed))));
  const float32x4_t d =
      vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(codes, 7))), kQ4ScaleFactor);
  std::memcpy(&packed, t.zero + 4 * quad, 4);
  const uint32x4_t zeros =
      vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(packed)))));
  return {d, vmulq_f32(d, vmulq_n_f32(vcvtq_f32_u32(zeros), 0.0625f))};
}

}  // namespace
}  // namespace klein::quant::detail
