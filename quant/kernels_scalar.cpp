// Portable kernels: plain C++ for any CPU (the compiler vectorises what it can at the baseline
// ISA). They are the path of KLEIN_ISA=scalar and the model the SIMD kernels follow; their
// int8 activation quantizer is the definition every instruction set reproduces bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

constexpr int kPanelCols = 16;
constexpr int kGemmRows = 4;
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
      act.scale[e] = d;
      act.scaled_sum[e] = d * float(sum);
      act.neg128_sum[e] = -128 * sum;
    }
  }
}

void tiles_q8(const ActBlocks& act, int64_t m0, int64_t b0, int rows, const TileQ8* tiles,
              int64_t nblocks, float* y, int64_t ldy, int cols, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float acc = accumulate ? y[r * ldy + c] : 0.0f;
      for (int64_t b = 0; b < nblocks; ++b) {
        const TileQ8& t = tiles[b];
        const int64_t e = act.entry(m0 + r, b0 + b);
        const int8_t* xq = act.q + e * kBlock;
        int32_t sum = act.neg128_sum[e];  // the tile stores q + 128
        for (int g = 0; g < kBlock / 4; ++g)
          for (int i = 0; i < 4; ++i) sum += int32_t(t.q[g][c][i]) * xq[4 * g + i];
        acc += float(sum) * (f16_to_f32(t.scale[c]) * act.scale[e]);
      }
      y[r * ldy + c] = acc;
    }
  }
}

void tiles_q4(const ActBlocks& act, int64_t m0, int64_t b0, int rows, const TileQ4* tiles,
              int64_t nblocks, float* y, int64_t ldy, int cols, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      float acc = accumulate ? y[r * ldy + c] : 0.0f;
      for (int64_t b = 0; b < nblocks; ++b) {
        const TileQ4& t = tiles[b];
        const int64_t e = act.entry(m0 + r, b0 + b);
        const int8_t* xq = act.q + e * kBlock;
        int32_t sum = 0;
        for (int g = 0; g < kBlock / 8; ++g) {
          for (int i = 0; i < 4; ++i) {
            sum += int32_t(t.q[g][c][i] & 15) * xq[4 * g + i];
            sum += int32_t(t.q[g][c][i] >> 4) * xq[16 + 4 * g + i];
          }
        }
        // w = d * q - d * z: the integer sum carries d * q, the zero point comes in through
        // the activation block sums.
        const float d = q4_scale(t.scale[c]);
        const float dz = d * (float(t.zero[c]) * 0.0625f);
        acc += float(sum) * (d * act.scale[e]);
        acc -= dz * act.scaled_sum[e];
      }
      y[r * ldy + c] = acc;
    }
  }
}

float load_as_f32(DType type, const void* w, int64_t i) {
  switch (type) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
    default: return static_cast<const float*>(w)[i];
  }
}

void pack_panel(DType type, const void* w, int64_t ldw, int rows, int kc, float* panel) {
  for (int k = 0; k < kc; ++k)
    for (int c = 0; c < kPanelCols; ++c)
      panel[k * kPanelCols + c] = c < rows ? load_as_f32(type, w, c * ldw + k) : 0.0f;
}

void pack_rows(const float* x, int64_t ldx, int rows, int kc, float* out) {
  for (int k = 0; k < kc; ++k)
    for (int r = 0; r < kGemmRows; ++r) out[k * kGemmRows + r] = r < rows ? x[r * ldx + k] : 0.0f;
}

void gemm_panel(const float* xp, int rows, const float* panel, int kc, float* y, int64_t ldy,
                int cols, bool accumulate) {
  for (int r = 0; r < rows; ++r) {
    float acc[kPanelCols] = {};
    for (int k = 0; k < kc; ++k) {
      const float xv = xp[k * kGemmRows + r];
      for (int c = 0; c < kPanelCols; ++c) acc[c] += xv * panel[k * kPanelCols + c];
    }
    for (int c = 0; c < cols; ++c) y[r * ldy + c] = (accumulate ? y[r * ldy + c] : 0.0f) + acc[c];
  }
}

// Eight partial sums: a shape the compiler vectorises without reassociating anything.
float dot8(const float* a, const float* b, int n) {
  float s[8] = {};
  for (int k = 0; k < n; k += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[k + j] * b[k + j];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void dot_rows(DType type, const float* x, int64_t ldx, int rows, const void* w, int64_t ldw,
              int wrows, int64_t K, float* y, int64_t ldy, bool accumulate) {
  constexpr int kChunk = 256;  // converted W values per row held at once
  float wf[kChunk];
  float acc[kDotRows][kDotCols] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
    const int n = int(std::min<int64_t>(kChunk, K - k0));
    for (int c = 0; c < wrows; ++c) {
      for (int k = 0; k < n; ++k) wf[k] = load_as_f32(type, w, c * ldw + k0 + k);
      for (int r = 0; r < rows; ++r) acc[r][c] += dot8(x + r * ldx + k0, wf, n);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < wrows; ++c) y[r * ldy + c] = (accumulate ? y[r * ldy + c] : 0.0f) + acc[r][c];
}

}  // namespace

const Kernels& scalar_kernels() {
  static const Kernels k{Isa::Scalar, kIntRows,  kGemmRows,  kPanelCols, quantize_rows, tiles_q8,
                         tiles_q4,    pack_rows, pack_panel, gemm_panel, dot_rows};
  return k;
}

}  // namespace klein::quant::detail
