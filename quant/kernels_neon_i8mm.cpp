// Integer tiles for aarch64 CPUs with the int8 matrix multiply (FEAT_I8MM; compiled with
// -march=armv8.2-a+fp16+dotprod+i8mm, called only where the CPU has it). neon_kernels() in
// kernels_neon.cpp pairs them with its activation quantizer.
//
// SMMLA multiplies a 2x8 matrix of int8 by the transpose of another 2x8 and adds the 2x2 int32
// product to an accumulator: 32 multiply-adds per instruction, twice SDOT's 16. Here the first
// operand is two activation rows (m0, m1) and the second two weight rows, i.e. two output
// columns (n0, n1), over 8 consecutive k; the sums come out as lanes (m0 n0, m0 n1, m1 n0,
// m1 n1).
//
// Operands from the stored layouts, without copying anything:
// - A tile vector holds k 4g..4g+3 of 4 columns (16 bytes). Zipping the 32-bit lanes of groups
//   g and g+1 gives columns 0 and 1 over k 4g..4g+7 (zip1) and columns 2 and 3 (zip2).
// - The activation stream keeps the 32 bytes of one block of each row next to each other, so
//   rows 2p and 2p+1 are 64 contiguous bytes: LD4 of 64-bit elements hands out the four
//   pairs (row 2p, k 8c..8c+7 | row 2p+1, k 8c..8c+7) for c = 0..3 in one instruction.
// An odd row count computes one row too many (the stream always has kNeonIntRows entries per
// block) and does not store it.
#include <arm_neon.h>

#include <type_traits>

#include "quant/kernel_common.h"
#include "quant/kernels.h"
#include "quant/neon_common.h"

namespace klein::quant::detail {
namespace {

using ActStream = ActStreamOf<kNeonIntRows>;

// A row pair's sums, (m0 n0, m0 n1, m1 n0, m1 n1) for columns n = 0, 1 in c01 and n = 2, 3
// in c23: rows m0 and (if `second`) m1 of y get their four columns back in order.
inline void store_pair(float32x4_t c01, float32x4_t c23, float* y, int64_t ldy, bool second,
                       int cols, bool accumulate) {
  store4(y, vcombine_f32(vget_low_f32(c01), vget_low_f32(c23)), cols, accumulate);
  if (second)
    store4(y + ldy, vcombine_f32(vget_high_f32(c01), vget_high_f32(c23)), cols, accumulate);
}

// (v0, v0, v1, v1) from the numbers v of rows 2p and 2p + 1 (one load serves two pairs once
// the pair loop is unrolled; the stream has kNeonIntRows entries per block).
inline float32x4_t pair_lanes(const float* v, int p) {
  const float32x4_t four = vld1q_f32(v + 4 * (p / 2));
  return p % 2 == 0 ? vzip1q_f32(four, four) : vzip2q_f32(four, four);
}

// The 4 activation pairs of rows 2p, 2p + 1 in the current block.
inline int64x2x4_t load_pairs(const ActStream& x, int p) {
  return vld4q_s64(reinterpret_cast<const int64_t*>(x.q + 2 * p * kBlock));
}

// ---- Weights ---------------------------------------------------------------------------------

// The SMMLA operands of tile rows (output columns) 4 quad .. 4 quad + 3: w[c][n] holds columns
// 2n, 2n + 1 over k 8c .. 8c + 7.
//
// Q8: the tile stores q + 128; flipping the top bit gives q back as a signed byte (signed x
// signed), so no bias correction is needed.
inline void unpack_weights(const TileQ8& t, int quad, int8x16_t (&w)[4][2]) {
  const uint8x16_t bias = vdupq_n_u8(0x80);
#pragma GCC unroll 8
  for (int c = 0; c < 4; ++c) {
    const int32x4_t g0 = vreinterpretq_s32_u8(veorq_u8(vld1q_u8(t.q[2 * c][4 * quad]), bias));
    const int32x4_t g1 = vreinterpretq_s32_u8(veorq_u8(vld1q_u8(t.q[2 * c + 1][4 * quad]), bias));
    w[c][0] = vreinterpretq_s8_s32(vzip1q_s32(g0, g1));
    w[c][1] = vreinterpretq_s8_s32(vzip2q_s32(g0, g1));
  }
}

// Q4: byte g of a tile vector holds k 4g+i in its low nibble and 16+4g+i in its high nibble,
// so zipping groups (0, 1) and (2, 3) first and then masking / shifting gives the four k
// chunks: 0..7 and 16..23 from (0, 1), 8..15 and 24..31 from (2, 3).
inline void unpack_weights(const TileQ4& t, int quad, int8x16_t (&w)[4][2]) {
  const uint8x16_t nibble = vdupq_n_u8(15);
#pragma GCC unroll 8
  for (int h = 0; h < 2; ++h) {
    const uint32x4_t g0 = vreinterpretq_u32_u8(vld1q_u8(t.q[2 * h][4 * quad]));
    const uint32x4_t g1 = vreinterpretq_u32_u8(vld1q_u8(t.q[2 * h + 1][4 * quad]));
#pragma GCC unroll 8
    for (int n = 0; n < 2; ++n) {
      const uint8x16_t v = vreinterpretq_u8_u32(n == 0 ? vzip1q_u32(g0, g1) : vzip2q_u32(g0, g1));
      w[h][n] = vreinterpretq_s8_u8(vandq_u8(v, nibble));
      w[2 + h][n] = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
    }
  }
}

// ---- Tiles ---------------------------------------------------------------------------------

// y[r, 4 quad .. 4 quad + 3] for activation rows r < R, over `nblocks` tiles of Q8 or Q4.
template <int R, class Tile>
void quad_tiles(ActStream x, const Tile* tiles, int64_t nblocks, int quad, float* y, int64_t ldy,
                int cols, bool accumulate) {
  constexpr bool kQ4 = std::is_same_v<Tile, TileQ4>;
  constexpr int P = (R + 1) / 2;
  float32x4_t acc[P][2];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) acc[p][0] = acc[p][1] = vdupq_n_f32(0.0f);
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const Tile& t = tiles[b];
    int8x16_t w[4][2];  // [k chunk][column pair]
    unpack_weights(t, quad, w);
    float32x4_t d, dz = vdupq_n_f32(0.0f);  // dz: Q4's zero-point term
    if constexpr (kQ4) {
      const Q4Scales s = q4_scales(t, quad);
      d = s.d;
      dz = s.dz;
    } else {
      d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(t.scale + 4 * quad)));
    }
    const float32x4_t d01 = vcombine_f32(vget_low_f32(d), vget_low_f32(d));
    const float32x4_t d23 = vcombine_f32(vget_high_f32(d), vget_high_f32(d));
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
      const int64x2x4_t a = load_pairs(x, p);
      int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        s0 = vmmlaq_s32(s0, vreinterpretq_s8_s64(a.val[c]), w[c][0]);
        s1 = vmmlaq_s32(s1, vreinterpretq_s8_s64(a.val[c]), w[c][1]);
      }
      const float32x4_t xs = pair_lanes(x.scale, p);
      acc[p][0] = vfmaq_f32(acc[p][0], vcvtq_f32_s32(s0), vmulq_f32(d01, xs));
      acc[p][1] = vfmaq_f32(acc[p][1], vcvtq_f32_s32(s1), vmulq_f32(d23, xs));
      if constexpr (kQ4) {  // minus d · zero · (the activations' scaled sum)
        const float32x4_t xz = pair_lanes(x.scaled_sum, p);
        acc[p][0] = vfmsq_f32(acc[p][0], vcombine_f32(vget_low_f32(dz), vget_low_f32(dz)), xz);
        acc[p][1] = vfmsq_f32(acc[p][1], vcombine_f32(vget_high_f32(dz), vget_high_f32(dz)), xz);
      }
    }
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p)
    store_pair(acc[p][0], acc[p][1], y + 2 * p * ldy + 4 * quad, ldy, 2 * p + 1 < R,
               cols - 4 * quad, accumulate);
}

template <int R>
struct Rows {
  template <class Tile>
  static void run(const ActStream& x, const Tile* tiles, int64_t nblocks, float* y, int64_t ldy,
                  int cols, bool accumulate) {
    for (int quad = 0; 4 * quad < cols; ++quad)
      quad_tiles<R>(x, tiles, nblocks, quad, y, ldy, cols, accumulate);
  }
};
using Tiles = RowKernels<kNeonIntRows, Rows>;

}  // namespace

Kernels neon_i8mm_kernels(QuantizeRowsFn quantize_rows) {
  return Kernels{Isa::Neon, kNeonIntRows, quantize_rows, Tiles::tiles<TileQ8>,
                 Tiles::tiles<TileQ4>};
}

}  // namespace klein::quant::detail
