// Direct stride-1 convolution rows with AVX-512 (compiled with -mavx512f; called only when the
// CPU has it). About half of the 5 T multiply-adds of a 1024x1024 decode run through here.
#include <immintrin.h>

#include <algorithm>

#include "ops/conv2d_kernels.h"

namespace klein::ops::detail {

namespace {

constexpr int kLanes = 16;
constexpr int kMaxVectors = 6;  // 4 channels x 6 vectors = 24 accumulators of 32 registers

// The accumulators of a register tile into output rows, the last vector masked.
template <int V>
inline void store_tile(const __m512 (&acc)[kDirectBlock][V], __mmask16 last, float* out, int64_t ld,
                       int64_t channels_out) {
#pragma GCC unroll 8
  for (int j = 0; j < kDirectBlock; ++j)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) {
      if (j >= channels_out) break;
      float* o = out + j * ld + v * kLanes;
      if (v + 1 < V)
        _mm512_storeu_ps(o, acc[j][v]);
      else
        _mm512_mask_storeu_ps(o, last, acc[j][v]);
    }
}

// Pixels [x_begin, x_end) of one output row in register tiles: pixel blocks outer, so a
// block's input (C x k rows x ~100 values) stays in L2 while the weights of all output
// channels stream past it. Blocks of equal numbers of vectors: 128 pixels run as 2 x 64, not
// 96 + 32 (a 2-vector tile has too few accumulators to hide the latency).
// tile(vectors, x, last, co) computes channels [co, co + kDirectBlock) at pixels from x.
template <class Tile>
inline void row_in_tiles(int64_t out_channels, int64_t x_begin, int64_t x_end, Tile tile) {
  const int64_t vectors_total = (x_end - x_begin + kLanes - 1) / kLanes;
  const int64_t blocks = (vectors_total + kMaxVectors - 1) / kMaxVectors;
  const int64_t block = (vectors_total + blocks - 1) / blocks * kLanes;
  for (int64_t x = x_begin; x < x_end; x += block) {
    const int64_t n = std::min(block, x_end - x);
    const int vectors = int((n + kLanes - 1) / kLanes);
    const int tail = int(n - (vectors - 1) * kLanes);
    const __mmask16 last = __mmask16((1u << tail) - 1u);
    for (int64_t co = 0; co < out_channels; co += kDirectBlock) tile(vectors, x, last, co);
  }
}

// Output channels [co, co + 4) x pixels [x, x + 16·V) of one row, the last vector masked.
// Per (c, ky, kx): 4 weight broadcasts and V loads feed 4·V FMAs, so the loop is bound by
// the FMA ports, not by loads.
template <int V>
void tile(const DirectBand& b, const float* w, const float* in, __mmask16 last, float* out,
          int64_t ld, int64_t channels_out) {
  // Fully unrolled so the accumulators live in registers.
  __m512 acc[kDirectBlock][V];
#pragma GCC unroll 8
  for (int j = 0; j < kDirectBlock; ++j)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[j][v] = _mm512_setzero_ps();
  const int64_t plane = b.rows * b.width, k = b.kernel;
  for (int64_t c = 0; c < b.channels; ++c, in += plane) {
    // The rows of channel c + 2 are each a separate short stream (C x k of them per tile),
    // too many for the hardware prefetcher: fetch them ahead explicitly.
    if (c + 2 < b.channels)
      for (int64_t ky = 0; ky < k; ++ky)
        for (int64_t i = 0; i < V * kLanes + k; i += kLanes)
          _mm_prefetch(reinterpret_cast<const char*>(in + 2 * plane + ky * b.width + i), _MM_HINT_T0);
    for (int64_t ky = 0; ky < k; ++ky) {
      const float* row = in + ky * b.width;
      for (int64_t kx = 0; kx < k; ++kx, w += kDirectBlock) {
        __m512 wv[kDirectBlock];
#pragma GCC unroll 8
        for (int j = 0; j < kDirectBlock; ++j) wv[j] = _mm512_set1_ps(w[j]);
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m512 x = v + 1 < V ? _mm512_loadu_ps(row + kx + v * kLanes)
                                     : _mm512_maskz_loadu_ps(last, row + kx + v * kLanes);
#pragma GCC unroll 8
          for (int j = 0; j < kDirectBlock; ++j) acc[j][v] = _mm512_fmadd_ps(wv[j], x, acc[j][v]);
        }
      }
    }
  }
  store_tile<V>(acc, last, out, ld, channels_out);
}

using TileFn = void (*)(const DirectBand&, const float*, const float*, __mmask16, float*, int64_t,
                        int64_t);
constexpr TileFn kTiles[kMaxVectors + 1] = {nullptr,  &tile<1>, &tile<2>, &tile<3>,
                                            &tile<4>, &tile<5>, &tile<6>};

}  // namespace

void direct_conv_row_avx512(const DirectBand& band, const float* packed, int64_t out_channels,
                            int64_t oy, int64_t x_begin, int64_t x_end, float* result, int64_t ld) {
  const int64_t group = band.channels * band.kernel * band.kernel * kDirectBlock;
  const float* in_row = band.data + oy * band.width;
  row_in_tiles(out_channels, x_begin, x_end,
               [&](int vectors, int64_t x, __mmask16 last, int64_t co) {
                 kTiles[vectors](band, packed + co / kDirectBlock * group, in_row + x, last,
                                 result + co * ld + x, ld, out_channels - co);
               });
}

// ---- the same on bf16 pairs (AVX-512 BF16 without AMX) -------------------------------------

namespace {

// Output channels [co, co + 4) x pixels [x, x + 16·V) of one row from a band of channel pairs:
// per (pair, ky, kx), 4 dword broadcasts (the pair's two weights) and V loads of 16 pixels'
// pairs feed 4·V VDPBF16PS, each 32 products summed into float32, twice the FMA form's.
template <int V>
void tile_bf16(const Bf16Band& b, const uint32_t* w, const uint32_t* in, __mmask16 last,
               float* out, int64_t ld, int64_t channels_out) {
  __m512 acc[kDirectBlock][V];
#pragma GCC unroll 8
  for (int j = 0; j < kDirectBlock; ++j)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[j][v] = _mm512_setzero_ps();
  const int64_t plane = b.rows * b.width, k = b.kernel;
  for (int64_t cp = 0; cp < b.pairs; ++cp, in += plane) {
    if (cp + 2 < b.pairs)
      for (int64_t ky = 0; ky < k; ++ky)
        for (int64_t i = 0; i < V * kLanes + k; i += kLanes)
          _mm_prefetch(reinterpret_cast<const char*>(in + 2 * plane + ky * b.width + i), _MM_HINT_T0);
    for (int64_t ky = 0; ky < k; ++ky) {
      const uint32_t* row = in + ky * b.width;
      for (int64_t kx = 0; kx < k; ++kx, w += kDirectBlock) {
        __m512bh wv[kDirectBlock];
#pragma GCC unroll 8
        for (int j = 0; j < kDirectBlock; ++j)
          wv[j] = __m512bh(_mm512_set1_epi32(int(w[j])));
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const __m512bh x = __m512bh(v + 1 < V ? _mm512_loadu_si512(row + kx + v * kLanes)
                                                : _mm512_maskz_loadu_epi32(last, row + kx + v * kLanes));
#pragma GCC unroll 8
          for (int j = 0; j < kDirectBlock; ++j) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], x, wv[j]);
        }
      }
    }
  }
  store_tile<V>(acc, last, out, ld, channels_out);
}

using TileBf16Fn = void (*)(const Bf16Band&, const uint32_t*, const uint32_t*, __mmask16, float*,
                            int64_t, int64_t);
constexpr TileBf16Fn kTilesBf16[kMaxVectors + 1] = {nullptr,        &tile_bf16<1>, &tile_bf16<2>,
                                                    &tile_bf16<3>, &tile_bf16<4>, &tile_bf16<5>,
                                                    &tile_bf16<6>};

}  // namespace

void direct_conv_row_bf16_avx512(const Bf16Band& band, const uint32_t* packed,
                                 int64_t out_channels, int64_t oy, int64_t x_begin, int64_t x_end,
                                 float* result, int64_t ld) {
  const int64_t group = band.pairs * band.kernel * band.kernel * kDirectBlock;
  const uint32_t* in_row = band.data + oy * band.width;
  row_in_tiles(out_channels, x_begin, x_end,
               [&](int vectors, int64_t x, __mmask16 last, int64_t co) {
                 kTilesBf16[vectors](band, packed + co / kDirectBlock * group, in_row + x, last,
                                     result + co * ld + x, ld, out_channels - co);
               });
}

}  // namespace klein::ops::detail
