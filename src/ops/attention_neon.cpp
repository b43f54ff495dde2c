// Softmax chunks of the tiled attention with NEON (compiled with the ARM flags; NEON is part of
// every aarch64 CPU): 4 scores per instruction and a polynomial exp instead of a libm call per
// score, as attention_avx2.cpp does with 8.
//
// Scores in base 2 as there: t = s·scale·log2(e), p = 2^(t − max t), one fused multiply-add
// for the scale, the change of base and the subtraction of the maximum. row_max holds max t.
// NEON has no masked loads: the last, partial group of a row goes through a 4-float copy.
// (Rescaling the accumulated rows needs no kernel of its own here: on aarch64 the portable
// loop of attention.cpp is vectorised with NEON by the compiler.)
#include <arm_neon.h>

#include <cmath>

#include "ops/attention_kernels.h"

namespace klein::ops::detail {

namespace {

constexpr int64_t kLanes = 4;

// 2^t for t <= 128: kExp2Poly at f = t - round(t) times 2^round(t) put into the exponent
// bits, t clamped at -126 first so that 2^round(t) stays a normal number (as in
// attention_avx2.cpp).
float32x4_t exp2_neon(float32x4_t t) {
  t = vmaxq_f32(t, vdupq_n_f32(-126.0f));
  const float32x4_t n = vrndnq_f32(t);
  const float32x4_t f = vsubq_f32(t, n);
  float32x4_t p = vdupq_n_f32(kExp2Poly[0]);
  for (int d = 1; d < 7; ++d) p = vfmaq_f32(vdupq_n_f32(kExp2Poly[d]), p, f);
  const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(bits));
}

// Lanes [j, j + 4) of p, zero from `end` on.
float32x4_t load_below(const float* p, int64_t j, int64_t end) {
  if (end - j >= kLanes) return vld1q_f32(p + j);
  float part[kLanes] = {0, 0, 0, 0};
  for (int64_t l = 0; l < end - j; ++l) part[l] = p[j + l];
  return vld1q_f32(part);
}

// Stores the lanes of v for keys [j, j + 4) below `end`.
void store_below(float* p, int64_t j, int64_t end, float32x4_t v) {
  if (end - j >= kLanes) {
    vst1q_f32(p + j, v);
    return;
  }
  float part[kLanes];
  vst1q_f32(part, v);
  for (int64_t l = 0; l < end - j; ++l) p[j + l] = part[l];
}

// All ones in the lanes of keys [j, j + 4) that the row sees: below n, and not hidden by the
// bias.
uint32x4_t shown_lanes(int64_t j, int64_t n, const float* bias) {
  const int32_t lane[kLanes] = {0, 1, 2, 3};
  const int32x4_t key = vaddq_s32(vdupq_n_s32(int32_t(j)), vld1q_s32(lane));
  uint32x4_t m = vcltq_s32(key, vdupq_n_s32(int32_t(n)));
  if (bias) m = vandq_u32(m, vceqq_f32(load_below(bias, j, n), vdupq_n_f32(0.0f)));
  return m;
}

// Pass 1 of row i: the new running maximum of t over the chunk's visible keys and the
// correction for what was accumulated before; -inf when the row has seen nothing yet.
float update_max(const SoftmaxChunk& c, int64_t i, const float* s, int64_t n, float32x4_t to_t) {
  const float32x4_t neg_inf = vdupq_n_f32(-INFINITY);
  float32x4_t vmax = neg_inf;
  for (int64_t j = 0; j < n; j += kLanes) {
    const float32x4_t t = vmulq_f32(load_below(s, j, n), to_t);
    vmax = vmaxq_f32(vmax, vbslq_f32(shown_lanes(j, n, c.bias), t, neg_inf));
  }
  const float chunk_max = vmaxvq_f32(vmax);
  const float old_max = c.row_max[i];
  const float new_max = old_max > chunk_max ? old_max : chunk_max;
  c.correction[i] = new_max == -INFINITY ? 1.0f : exp2f(old_max - new_max);
  return new_max;
}

}  // namespace

void softmax_chunk_f32_neon(const SoftmaxChunk& c) {
  const float32x4_t to_t = vdupq_n_f32(c.scale * kLog2e);
  for (int64_t i = 0; i < c.rows; ++i) {
    float* s = c.scores + i * c.ld;
    const int64_t n = c.visible(i);
    const float max = update_max(c, i, s, n, to_t);
    const float32x4_t neg_max = vdupq_n_f32(-max);
    float32x4_t sum = vdupq_n_f32(0.0f);
    for (int64_t j = 0; j < c.cols; j += kLanes) {
      float32x4_t p = vdupq_n_f32(0.0f);
      if (max != -INFINITY) {
        const uint32x4_t shown = shown_lanes(j, n, c.bias);
        const float32x4_t t = vfmaq_f32(neg_max, load_below(s, j, n), to_t);  // x·to_t − max
        p = vreinterpretq_f32_u32(vandq_u32(shown, vreinterpretq_u32_f32(exp2_neon(t))));
        sum = vaddq_f32(sum, p);
      }
      store_below(s, j, c.cols, p);
    }
    if (max == -INFINITY) continue;
    c.row_sum[i] = c.row_sum[i] * c.correction[i] + vaddvq_f32(sum);
    c.row_max[i] = max;
  }
}

}  // namespace klein::ops::detail
