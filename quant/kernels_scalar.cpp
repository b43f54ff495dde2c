// Portable kernels: plain C++ for any CPU (the compiler vectorises what it can at the baseline
// ISA). They are the path of KLEIN_ISA=scalar and the model the SIMD kernels follow; their
// int8 activation quantizer is the definition every instruction set reproduces bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/kernel_common.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

constexpr int kIntRows = 4;

void quantize_rows(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K,
                   const ActBlocks& act) {
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const float* xb = x + m * ldx + b * kBlock;
      const int64_t e = act.entry(m, b);
      int8_t* q = act.q + e * kBlock;
      float amax = 0;
      for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(xb[i]));
      // Both divisions are correctly rounded, so vector code computes the same two values.
      const float d = amax / 127.0f;
      const float inv_d = amax > 0 ? 127.0f / amax : 0.0f;
      int32_t sum = 0;
      for (int i = 0; i < kBlock; ++i) {
        q[i] = int8_t(round_even(xb[i] * inv_d));  // ties to even, like cvtps2dq
        sum += q[i];
      }
      store_block_sums(act, e, d, sum);
    }
  }
}

// Adds one block's contribution to an output (row, column c): tile row c times activation
// entry e.
void add_block(float& acc, const TileQ8& t, int c, const ActBlocks& act, int64_t e) {
  const int8_t* xq = act.q + e * kBlock;
  int32_t sum = act.neg128_sum[e];  // the tile stores q + 128
  for (int g = 0; g < kBlock / 4; ++g)
    for (int i = 0; i < 4; ++i) sum += int32_t(t.q[g][c][i]) * xq[4 * g + i];
  acc += float(sum) * (f16_to_f32(t.scale[c]) * act.scale[e]);
}

void add_block(float& acc, const TileQ4& t, int c, const ActBlocks& act, int64_t e) {
  const int8_t* xq = act.q + e * kBlock;
  int32_t sum = 0;
  for (int g = 0; g < kBlock / 8; ++g) {
    for (int i = 0; i < 4; ++i) {
      sum += int32_t(t.q[g][c][i] & 15) * xq[4 * g + i];
      sum += int32_t(t.q[g][c][i] >> 4) * xq[16 + 4 * g + i];
    }
  }
  // w = d * q - d * z: the integer sum carries d * q, the zero point comes in through the
  // activation block sums.
  const float d = q4_scale(t.scale[c]);
  const float dz = d * (float(t.zero[c]) * 0.0625f);
  acc += float(sum) * (d * act.scale[e]);
  acc -= dz * act.scaled_sum[e];
}

template <class Tile>
void int_tiles(const ActBlocks& act, int64_t m0, int64_t b0, int rows, const Tile* tiles,
               int64_t nblocks, float* y, int64_t ldy, int cols, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float acc = accumulate ? y[r * ldy + c] : 0.0f;
      for (int64_t b = 0; b < nblocks; ++b)
        add_block(acc, tiles[b], c, act, act.entry(m0 + r, b0 + b));
      y[r * ldy + c] = acc;
    }
  }
}

}  // namespace

const Kernels& scalar_kernels() {
  static const Kernels k{Isa::Scalar, kIntRows, quantize_rows, int_tiles<TileQ8>,
                         int_tiles<TileQ4>};
  return k;
}

}  // namespace klein::quant::detail
