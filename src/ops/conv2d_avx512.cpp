// Direct stride-1 convolution rows with AVX-512 (compiled with -mavx512f; called only when the
// CPU has it), on float32 and, with AVX-512 BF16, on bf16 channel pairs. About half of the 5 T multiply-adds of a 1024x1024 decode run through here.
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

// What a register tile multiplies: float32 pixels and weights (one FMA per product), or
// bf16 channel pairs (AVX-512 BF16 without AMX: a dword holds one pixel's two channels or a
// weight pair, and VDPBF16PS sums 32 products into float32, twice the FMA form's).
struct Float32Pixels {
  using Band = DirectBand;
  using Value = float;
  using Vector = __m512;
  static int64_t depth(const Band& b) { return b.channels; }
  static Vector weight(const float* w) { return _mm512_set1_ps(*w); }
  static Vector load(const float* p) { return _mm512_loadu_ps(p); }
  static Vector load(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static __m512 madd(__m512 acc, Vector w, Vector x) { return _mm512_fmadd_ps(w, x, acc); }
};

struct Bf16Pairs {
  using Band = Bf16Band;
  using Value = uint32_t;
  using Vector = __m512bh;
  static int64_t depth(const Band& b) { return b.pairs; }
  static Vector weight(const uint32_t* w) { return __m512bh(_mm512_set1_epi32(int(*w))); }
  static Vector load(const uint32_t* p) { return __m512bh(_mm512_loadu_si512(p)); }
  static Vector load(__mmask16 m, const uint32_t* p) {
    return __m512bh(_mm512_maskz_loadu_epi32(m, p));
  }
  static __m512 madd(__m512 acc, Vector w, Vector x) { return _mm512_dpbf16_ps(acc, x, w); }
};

// Output channels [co, co + 4) x pixels [x, x + 16·V) of one row, the last vector masked.
// Per (input channel or pair, ky, kx): 4 weight broadcasts and V loads feed 4·V multiply-adds,
// so the loop is bound by the FMA ports, not by loads.
template <class P, int V>
void tile(const typename P::Band& b, const typename P::Value* w, const typename P::Value* in,
          __mmask16 last, float* out, int64_t ld, int64_t channels_out) {
  // Fully unrolled so the accumulators live in registers.
  __m512 acc[kDirectBlock][V];
#pragma GCC unroll 8
  for (int j = 0; j < kDirectBlock; ++j)
#pragma GCC unroll 8
    for (int v = 0; v < V; ++v) acc[j][v] = _mm512_setzero_ps();
  const int64_t plane = b.rows * b.width, k = b.kernel, depth = P::depth(b);
  for (int64_t c = 0; c < depth; ++c, in += plane) {
    // The rows of channel c + 2 are each a separate short stream (C x k of them per tile),
    // too many for the hardware prefetcher: fetch them ahead explicitly.
    if (c + 2 < depth)
      for (int64_t ky = 0; ky < k; ++ky)
        for (int64_t i = 0; i < V * kLanes + k; i += kLanes)
          _mm_prefetch(reinterpret_cast<const char*>(in + 2 * plane + ky * b.width + i), _MM_HINT_T0);
    for (int64_t ky = 0; ky < k; ++ky) {
      const typename P::Value* row = in + ky * b.width;
      for (int64_t kx = 0; kx < k; ++kx, w += kDirectBlock) {
        typename P::Vector wv[kDirectBlock];
#pragma GCC unroll 8
        for (int j = 0; j < kDirectBlock; ++j) wv[j] = P::weight(w + j);
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v) {
          const typename P::Vector x = v + 1 < V ? P::load(row + kx + v * kLanes)
                                                 : P::load(last, row + kx + v * kLanes);
#pragma GCC unroll 8
          for (int j = 0; j < kDirectBlock; ++j) acc[j][v] = P::madd(acc[j][v], wv[j], x);
        }
      }
    }
  }
  store_tile<V>(acc, last, out, ld, channels_out);
}

// One output row of either kind: `group` packed weights per block of kDirectBlock channels.
template <class P>
void direct_conv_row(const typename P::Band& band, const typename P::Value* packed,
                     int64_t out_channels, int64_t oy, int64_t x_begin, int64_t x_end,
                     float* result, int64_t ld) {
  using TileFn = void (*)(const typename P::Band&, const typename P::Value*,
                          const typename P::Value*, __mmask16, float*, int64_t, int64_t);
  static constexpr TileFn kTiles[kMaxVectors + 1] = {
      nullptr, &tile<P, 1>, &tile<P, 2>, &tile<P, 3>, &tile<P, 4>, &tile<P, 5>, &tile<P, 6>};
  const int64_t group = P::depth(band) * band.kernel * band.kernel * kDirectBlock;
  const typename P::Value* in_row = band.data + oy * band.width;
  row_in_tiles(out_channels, x_begin, x_end,
               [&](int vectors, int64_t x, __mmask16 last, int64_t co) {
                 kTiles[vectors](band, packed + co / kDirectBlock * group, in_row + x, last,
                                 result + co * ld + x, ld, out_channels - co);
               });
}

}  // namespace

void direct_conv_row_avx512(const DirectBand& band, const float* packed, int64_t out_channels,
                            int64_t oy, int64_t x_begin, int64_t x_end, float* result, int64_t ld) {
  direct_conv_row<Float32Pixels>(band, packed, out_channels, oy, x_begin, x_end, result, ld);
}

void direct_conv_row_bf16_avx512(const Bf16Band& band, const uint32_t* packed,
                                 int64_t out_channels, int64_t oy, int64_t x_begin, int64_t x_end,
                                 float* result, int64_t ld) {
  direct_conv_row<Bf16Pairs>(band, packed, out_channels, oy, x_begin, x_end, result, ld);
}

}  // namespace klein::ops::detail
