// NEON kernels for aarch64 (compiled with -march=armv8.2-a+fp16+dotprod). The integer tiles use
// sdot where the CPU has it (FEAT_DotProd) and widening multiplies otherwise; both variants are
// compiled here and neon_kernels() picks one from the CPU's features, or the SMMLA tiles of
// kernels_neon_i8mm.cpp where the CPU has FEAT_I8MM.
//
// Integer tiles: 16 bytes of a tile vector are 4 columns of 4 rows, so one sdot by element
// (activation group g of a 16-byte load) adds 4 row sums. The tile is done one 4-row quad at a
// time, so that 8 activation rows keep their int32 and float sums in 16 of the 32 registers.
#include <arm_neon.h>

#include <utility>

#include "core/cpu.h"
#include "quant/kernel_common.h"
#include "quant/kernels.h"
#include "quant/neon_common.h"

namespace klein::quant::detail {
namespace {

constexpr int kIntRows = kNeonIntRows;

// Calls f(std::integral_constant<int, i>) for i = 0..N-1: lane numbers must be constants.
template <class F, int... I>
inline void unroll_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, class F>
inline void unroll(F&& f) {
  unroll_impl(f, std::make_integer_sequence<int, N>{});
}

// acc[i] += sum_j w[4i + j] * x[4L + j] (4 rows of w, group L of x).
template <bool kDotProd, int L>
inline int32x4_t dot4(int32x4_t acc, int8x16_t w, int8x16_t x) {
  if constexpr (kDotProd) {
    return vdotq_laneq_s32(acc, w, x, L);
  } else {
    const int8x16_t xr = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(x), L));
    const int16x8_t lo = vmull_s8(vget_low_s8(w), vget_low_s8(xr));  // rows 0, 1
    const int16x8_t hi = vmull_high_s8(w, xr);                       // rows 2, 3
    // Pairs of products fit int16 (|w|, |x| <= 127); pairs of pairs widen to int32.
    return vpadalq_s16(acc, vpaddq_s16(lo, hi));
  }
}

// ---- Activations ---------------------------------------------------------------------------

void quantize_rows(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K,
                   const ActBlocks& act) {
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const float* xb = x + m * ldx + b * kBlock;
      float32x4_t v[8];
      float32x4_t a = vdupq_n_f32(0.0f);
      for (int i = 0; i < 8; ++i) {
        v[i] = vld1q_f32(xb + 4 * i);
        a = vmaxq_f32(a, vabsq_f32(v[i]));
      }
      const float amax = vmaxvq_f32(a);
      const float d = amax / 127.0f;
      const float inv_d = amax > 0 ? 127.0f / amax : 0.0f;
      int32x4_t q[8];
      int32x4_t sum = vdupq_n_s32(0);
      for (int i = 0; i < 8; ++i) {
        q[i] = vcvtnq_s32_f32(vmulq_n_f32(v[i], inv_d));  // nearest, ties to even
        sum = vaddq_s32(sum, q[i]);
      }
      const int64_t e = act.entry(m, b);
      for (int h = 0; h < 2; ++h) {
        const int16x8_t lo = vcombine_s16(vqmovn_s32(q[4 * h]), vqmovn_s32(q[4 * h + 1]));
        const int16x8_t hi = vcombine_s16(vqmovn_s32(q[4 * h + 2]), vqmovn_s32(q[4 * h + 3]));
        vst1q_s8(act.q + e * kBlock + 16 * h, vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi)));
      }
      const int32_t s = vaddvq_s32(sum);
      store_block_sums(act, e, d, s);
    }
  }
}

using ActStream = ActStreamOf<kIntRows>;

// ---- Q8 tiles ------------------------------------------------------------------------------

// Tile rows 4 quad .. 4 quad + 3. The tile stores q + 128; flipping the top bit gives q back
// as a signed byte for sdot (signed x signed), so no bias correction is needed here.
template <bool kDotProd, int R>
void q8_quad(ActStream x, const TileQ8* tiles, int64_t nblocks, int quad, float* y, int64_t ldy,
             int cols, bool accumulate) {
  const uint8x16_t bias = vdupq_n_u8(0x80);
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ8& t = tiles[b];
    int32x4_t sum[R];
    for (int r = 0; r < R; ++r) sum[r] = vdupq_n_s32(0);
    for (int half = 0; half < 2; ++half) {
      int8x16_t w[4];
      for (int j = 0; j < 4; ++j)
        w[j] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(t.q[4 * half + j][4 * quad]), bias));
      for (int r = 0; r < R; ++r) {
        const int8x16_t xv = vld1q_s8(x.q + r * kBlock + 16 * half);
        unroll<4>([&](auto j) {
          constexpr int g = decltype(j)::value;
          sum[r] = dot4<kDotProd, g>(sum[r], w[g], xv);
        });
      }
    }
    const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(t.scale + 4 * quad)));
    for (int r = 0; r < R; ++r)
      acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(sum[r]), vmulq_n_f32(d, x.scale[r]));
  }
  for (int r = 0; r < R; ++r) store4(y + r * ldy + 4 * quad, acc[r], cols - 4 * quad, accumulate);
}

// ---- Q4 tiles ------------------------------------------------------------------------------

template <bool kDotProd, int R>
void q4_quad(ActStream x, const TileQ4* tiles, int64_t nblocks, int quad, float* y, int64_t ldy,
             int cols, bool accumulate) {
  const uint8x16_t nibble = vdupq_n_u8(15);
  float32x4_t acc[R];
  for (int r = 0; r < R; ++r) acc[r] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ4& t = tiles[b];
    int8x16_t lo[4], hi[4];  // columns 4g.. and 16+4g.. of the quad's rows
    for (int g = 0; g < 4; ++g) {
      const uint8x16_t v = vld1q_u8(t.q[g][4 * quad]);
      lo[g] = vreinterpretq_s8_u8(vandq_u8(v, nibble));
      hi[g] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    }
    int32x4_t sum[R];
    for (int r = 0; r < R; ++r) {
      const int8x16_t xlo = vld1q_s8(x.q + r * kBlock), xhi = vld1q_s8(x.q + r * kBlock + 16);
      sum[r] = vdupq_n_s32(0);
      unroll<4>([&](auto j) {
        constexpr int g = decltype(j)::value;
        sum[r] = dot4<kDotProd, g>(sum[r], lo[g], xlo);
        sum[r] = dot4<kDotProd, g>(sum[r], hi[g], xhi);
      });
    }
    const auto [d, dz] = q4_scales(t, quad);
    for (int r = 0; r < R; ++r) {
      acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(sum[r]), vmulq_n_f32(d, x.scale[r]));
      acc[r] = vfmsq_f32(acc[r], dz, vdupq_n_f32(x.scaled_sum[r]));
    }
  }
  for (int r = 0; r < R; ++r) store4(y + r * ldy + 4 * quad, acc[r], cols - 4 * quad, accumulate);
}

template <bool kDotProd>
struct WithDotProd {
  template <int R>
  struct Rows {
    static void run(const ActStream& x, const TileQ8* tiles, int64_t nblocks, float* y, int64_t ldy,
                    int cols, bool accumulate) {
      for (int quad = 0; 4 * quad < cols; ++quad)
        q8_quad<kDotProd, R>(x, tiles, nblocks, quad, y, ldy, cols, accumulate);
    }
    static void run(const ActStream& x, const TileQ4* tiles, int64_t nblocks, float* y, int64_t ldy,
                    int cols, bool accumulate) {
      for (int quad = 0; 4 * quad < cols; ++quad)
        q4_quad<kDotProd, R>(x, tiles, nblocks, quad, y, ldy, cols, accumulate);
    }
  };
  using Tiles = RowKernels<kIntRows, Rows>;
};
using Dot = WithDotProd<true>::Tiles;
using NoDot = WithDotProd<false>::Tiles;

}  // namespace

const Kernels& neon_kernels() {
  static const Kernels with_dotprod{Isa::Neon, kIntRows, quantize_rows, Dot::tiles<TileQ8>,
                                    Dot::tiles<TileQ4>};
  static const Kernels without_dotprod{Isa::Neon, kIntRows, quantize_rows, NoDot::tiles<TileQ8>,
                                       NoDot::tiles<TileQ4>};
  static const Kernels with_i8mm = neon_i8mm_kernels(quantize_rows);
  const CpuFeatures& f = cpu_features();
  return f.neon_i8mm ? with_i8mm : f.neon_dotprod ? with_dotprod : without_dotprod;
}

}  // namespace klein::quant::detail
