// Convolution products on AMX tiles with BF16 inputs (ConvAlgorithm::Bf16Tiles; compiled with
// -mamx-tile -mamx-bf16 and called only when the CPU and OS allow AMX). One TDPBF16PS
// multiplies a 16 x 32 bf16 tile of weights by a 32 x 16 tile of columns into 16 x 16
// float32 sums, 8192 multiply-adds in one instruction.
//
// Per task (a run of a band's output pixels): the column matrix of those pixels is copied
// from the pair-interleaved band (conv2d_kernels.h), then for each block of 32 output
// channels and each block of 32 pixels, 2 A tiles x 2 B tiles accumulate into 4 C tiles over
// all of K, and the C tiles go through a small buffer to the output (bias, accumulation and
// the partial tiles at the edges handled there with AVX-512 masks).
#include <immintrin.h>
// GCC 12's intrinsics start some conversions from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <algorithm>
#include <cstring>

#include "quant/amx_tiles.h"
#include "ops/conv2d_kernels.h"

namespace klein::ops::detail {

namespace {

// Tiles 0-1: A (two blocks of 16 output channels); 2-3: B (two blocks of 16 pixels); 4-7: C
// (A block x B block), every tile 16 rows of 64 bytes (quant/amx_tiles.h).

constexpr int64_t kBlock = kBf16TilePixels;  // pixels per B tile
// The C buffer: 2 x 2 tiles of 16 x 16 floats, row stride 32 floats.
constexpr int64_t kCStride = 2 * kBlock;

// The column matrix of a task's pixels (rounded up to 16, its row stride `ldb`) is row-major,
// [pair row][pixel] dwords, as TDPBF16PS reads B: a B tile is 16 pair rows x 16 pixels,
// loaded with a row stride of 4 bytes x ldb. (Stored instead as 1 KiB tiles one after the
// other, its gather scatters its stores and the convolutions with 128 or fewer output
// channels ran 10-15% slower.)
int64_t pair_rows_padded(const Bf16Weights& w) { return w.k_padded / 2; }

// C[16·MA x 16·NB] = A rows [0, 16·MA) x B blocks b0 (and b1), over `steps` K steps.
template <int MA, int NB>
void multiply(const uint16_t* a, int64_t lda_bytes, const uint32_t* b0, const uint32_t* b1,
              int64_t ldb, int64_t steps, float* c) {
  const int64_t ldb_bytes = ldb * int64_t(sizeof(uint32_t)), b_step = 16 * ldb;
  const uint16_t* a1 = a + 16 * (lda_bytes / 2);
  _tile_zero(4);
  if constexpr (NB == 2) _tile_zero(5);
  if constexpr (MA == 2) _tile_zero(6);
  if constexpr (MA == 2 && NB == 2) _tile_zero(7);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_loadd(0, a + s * kBf16TileK, lda_bytes);
    _tile_loadd(2, b0 + s * b_step, ldb_bytes);
    if constexpr (MA == 2) _tile_loadd(1, a1 + s * kBf16TileK, lda_bytes);
    if constexpr (NB == 2) _tile_loadd(3, b1 + s * b_step, ldb_bytes);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (NB == 2) _tile_dpbf16ps(5, 0, 3);
    if constexpr (MA == 2) _tile_dpbf16ps(6, 1, 2);
    if constexpr (MA == 2 && NB == 2) _tile_dpbf16ps(7, 1, 3);
  }
  constexpr int64_t ldc = kCStride * int64_t(sizeof(float));
  _tile_stored(4, c, ldc);
  if constexpr (NB == 2) _tile_stored(5, c + kBlock, ldc);
  if constexpr (MA == 2) _tile_stored(6, c + 16 * kCStride, ldc);
  if constexpr (MA == 2 && NB == 2) _tile_stored(7, c + 16 * kCStride + kBlock, ldc);
}

using MultiplyFn = void (*)(const uint16_t*, int64_t, const uint32_t*, const uint32_t*, int64_t,
                            int64_t, float*);
constexpr MultiplyFn kMultiply[2][2] = {{&multiply<1, 1>, &multiply<1, 2>},
                                        {&multiply<2, 1>, &multiply<2, 2>}};

__mmask16 first_lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1u);
}

// Rows [0, rows) of the C buffer, columns [0, columns), to out (row stride ld) plus bias.
void write_out(const float* c, int64_t rows, int64_t columns, const float* bias, float* out,
               int64_t ld, bool accumulate) {
  const __mmask16 m0 = first_lanes(columns);
  const __mmask16 m1 = first_lanes(std::max<int64_t>(0, columns - kBlock));
  for (int64_t r = 0; r < rows; ++r) {
    const __m512 b = _mm512_set1_ps(bias ? bias[r] : 0.0f);
    float* o = out + r * ld;
    const float* cr = c + r * kCStride;
    __m512 v0 = _mm512_add_ps(_mm512_load_ps(cr), b);
    if (accumulate) v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, o));
    _mm512_mask_storeu_ps(o, m0, v0);
    if (m1) {
      __m512 v1 = _mm512_add_ps(_mm512_load_ps(cr + kBlock), b);
      if (accumulate) v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, o + kBlock));
      _mm512_mask_storeu_ps(o + kBlock, m1, v1);
    }
  }
}

// Where the 16 pixels of one block read the band, relative to the tap (0, 0) of pair 0:
// consecutive dwords from `start` when they lie in one output row at stride 1, else the
// offsets of each (pixels past the end read offset 0; their columns are never written out).
struct BlockSource {
  bool contiguous = false;
  int32_t start = 0;
  alignas(64) int32_t offset[16] = {};
};

void locate(const Bf16Band& band, int64_t out_width, int64_t p, int64_t valid, BlockSource& s) {
  const int64_t oy = p / out_width, ox = p % out_width;
  s.contiguous = band.stride == 1 && valid == kBlock && ox + kBlock <= out_width;
  s.start = int32_t(oy * band.stride * band.width + ox * band.stride);
  if (s.contiguous) return;
  for (int64_t i = 0; i < kBlock; ++i) {
    if (i >= valid) {
      s.offset[i] = 0;
      continue;
    }
    const int64_t y = (p + i) / out_width, x = (p + i) % out_width;
    s.offset[i] = int32_t(y * band.stride * band.width + x * band.stride);
  }
}

// The column matrix of `blocks` pixel blocks, row stride ldb: pair row (cp·k + ky)·k + kx is
// band pair cp at tap (ky, kx) for the blocks' pixels; the pair rows past the real K are zero.
void gather(const Bf16Band& band, const Bf16Weights& w, const BlockSource* sources,
            int64_t blocks, int64_t ldb, uint32_t* columns) {
  const int64_t k = band.kernel, plane = band.rows * band.width;
  const int64_t rows = band.pairs * k * k, padded = pair_rows_padded(w);
  for (int64_t cp = 0; cp < band.pairs; ++cp)
    for (int64_t ky = 0; ky < k; ++ky)
      for (int64_t kx = 0; kx < k; ++kx) {
        const uint32_t* src = band.data + cp * plane + ky * band.width + kx;
        uint32_t* dst = columns + ((cp * k + ky) * k + kx) * ldb;
        for (int64_t b = 0; b < blocks; ++b) {
          const BlockSource& s = sources[b];
          const __m512i v =
              s.contiguous
                  ? _mm512_loadu_si512(src + s.start)
                  : _mm512_i32gather_epi32(_mm512_load_si512(s.offset), src, sizeof(uint32_t));
          _mm512_store_si512(dst + b * kBlock, v);
        }
      }
  for (int64_t row = rows; row < padded; ++row)
    for (int64_t b = 0; b < blocks; ++b)
      _mm512_store_si512(columns + row * ldb + b * kBlock, _mm512_setzero_si512());
}

// ChannelAffine::apply in AVX-512, value for value: the same operations in the same order.
// Each product goes through an empty asm so that the compiler cannot fuse it with the next
// addition into an FMA (this file is built with -mfma and C++ allows contraction; the
// baseline build of group_norm.cpp rounds every product).
#define KLEIN_INLINE inline __attribute__((always_inline))

KLEIN_INLINE __m512 mul(__m512 a, __m512 b) {
  __m512 product = _mm512_mul_ps(a, b);
  asm("" : "+v"(product));
  return product;
}

// group_norm_kernels.h exp_vectorisable.
KLEIN_INLINE __m512 exp_like_group_norm(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
  const __m512i limit = _mm512_set1_epi32(0x42ae0000);  // 87.0f
  const __mmask16 clamp = _mm512_cmpgt_epu32_mask(magnitude, limit) &
                          _mm512_cmple_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i clamped =
      _mm512_or_si512(_mm512_and_si512(bits, _mm512_set1_epi32(int(0x80000000u))), limit);
  x = _mm512_castsi512_ps(_mm512_mask_mov_epi32(bits, clamp, clamped));
  const __m512 round = _mm512_set1_ps(12582912.0f);
  const __m512 shifted = _mm512_add_ps(mul(x, _mm512_set1_ps(1.44269504088896341f)), round);
  const __m512 n = _mm512_sub_ps(shifted, round);
  const __m512 r = _mm512_add_ps(_mm512_sub_ps(x, mul(n, _mm512_set1_ps(0.693359375f))),
                                 mul(n, _mm512_set1_ps(2.12194440e-4f)));
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_add_ps(mul(p, r), _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_add_ps(mul(p, r), _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_add_ps(mul(p, r), _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_add_ps(mul(p, r), _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_add_ps(mul(p, r), _mm512_set1_ps(5.0000001201e-1f));
  const __m512 er = _mm512_add_ps(_mm512_add_ps(mul(mul(p, r), r), r), _mm512_set1_ps(1.0f));
  const __m512i ni = _mm512_sub_epi32(_mm512_castps_si512(shifted), _mm512_castps_si512(round));
  const __m512i scale = _mm512_slli_epi32(_mm512_add_epi32(ni, _mm512_set1_epi32(127)), 23);
  return mul(er, _mm512_castsi512_ps(scale));
}

struct Affine {
  __m512 mean, scale, shift;
  bool silu = false;
};

Affine affine_of(const ChannelAffine& t, int64_t c) {
  return {_mm512_set1_ps(t.mean[size_t(c)]), _mm512_set1_ps(t.scale[size_t(c)]),
          _mm512_set1_ps(t.shift[size_t(c)]), t.silu};
}

KLEIN_INLINE __m512 apply(const Affine& a, __m512 x) {
  __m512 y = _mm512_add_ps(mul(_mm512_sub_ps(x, a.mean), a.scale), a.shift);
  if (a.silu) {
    const __m512 e = exp_like_group_norm(_mm512_xor_ps(y, _mm512_set1_ps(-0.0f)));  // e^-y
    y = _mm512_div_ps(y, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
  }
  return y;
}

#undef KLEIN_INLINE

}  // namespace

void pack_pairs_amx(const float* a, const float* b, int64_t n, const ChannelAffine* t, int64_t c,
                    uint32_t* out, int64_t repeat) {
  // cvtne2ps gives [bf16(a[0..15]), bf16(b[0..15])]; interleave them word by word.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10,
                                              25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3,
                                              18, 2, 17, 1, 16, 0);
  Affine fa, fb;
  if (t) {
    fa = affine_of(*t, c);
    if (b) fb = affine_of(*t, c + 1);
  }
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 m = first_lanes(n - x);
    __m512 va = _mm512_maskz_loadu_ps(m, a + x);
    __m512 vb = b ? _mm512_maskz_loadu_ps(m, b + x) : _mm512_setzero_ps();
    if (t) {
      va = apply(fa, va);
      if (b) vb = apply(fb, vb);
    }
    const __m512i words = __m512i(_mm512_cvtne2ps_pbh(vb, va));
    const __m512i pairs = _mm512_permutexvar_epi16(interleave, words);
    if (repeat == 1) {
      _mm512_mask_storeu_epi32(out + x, m, pairs);
    } else if (repeat == 2) {
      // Dwords 0-7 and 8-15 each twice.
      const __m512i low = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
      const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
      const int64_t left = 2 * std::min<int64_t>(16, n - x);
      _mm512_mask_storeu_epi32(out + 2 * x, first_lanes(left),
                               _mm512_permutexvar_epi32(low, pairs));
      if (left > 16)
        _mm512_mask_storeu_epi32(out + 2 * x + 16, first_lanes(left - 16),
                                 _mm512_permutexvar_epi32(high, pairs));
    } else {
      alignas(64) uint32_t values[16];
      _mm512_store_si512(values, pairs);
      for (int64_t i = 0; i < std::min<int64_t>(16, n - x); ++i)
        for (int64_t j = 0; j < repeat; ++j) out[(x + i) * repeat + j] = values[i];
    }
  }
}

int64_t bf16_columns_size(const Bf16Band& band, const Bf16Weights& w, int64_t pixels) {
  (void)band;
  const int64_t blocks = (pixels + kBlock - 1) / kBlock;
  return blocks * pair_rows_padded(w) * kBlock;
}

void bf16_tiles_conv_amx(const Bf16Band& band, const Bf16Weights& w, int64_t out_width,
                         int64_t p0, int64_t n, uint32_t* columns, float* out, int64_t ld,
                         bool accumulate) {
  const int64_t blocks = (n + kBlock - 1) / kBlock, ldb = blocks * kBlock;
  constexpr int64_t kMaxBlocks = 64;
  BlockSource sources[kMaxBlocks];
  for (int64_t b0 = 0; b0 < blocks; b0 += kMaxBlocks) {
    // Tasks are at most a few hundred pixels; a longer run is gathered in pieces.
    const int64_t count = std::min(kMaxBlocks, blocks - b0);
    for (int64_t b = 0; b < count; ++b) {
      const int64_t p = (b0 + b) * kBlock;
      locate(band, out_width, p0 + p, std::min(kBlock, n - p), sources[b]);
    }
    gather(band, w, sources, count, ldb, columns + b0 * kBlock);
  }

  const int64_t steps = w.k_padded / kBf16TileK;
  const int64_t lda_bytes = w.k_padded * int64_t(sizeof(uint16_t));
  alignas(64) float c[2 * 16 * kCStride];
  _tile_loadconfig(&quant::kAmxTileConfig);
  // Output channels outer: the A tiles of 32 channels (K x 64 bytes) stay in L2 while every
  // pixel block of the task passes by; the task's column matrix is sized to stay in L2 as
  // well (conv2d.cpp).
  for (int64_t co = 0; co < w.out_rows; co += 32) {
    const int ma = w.out_rows - co >= 32 ? 2 : 1;
    const int64_t rows = std::min<int64_t>(32, w.out_channels - co);
    if (rows <= 0) break;
    const uint16_t* a = w.data + co * w.k_padded;
    for (int64_t b = 0; b < blocks; b += 2) {
      const int nb = blocks - b >= 2 ? 2 : 1;
      const uint32_t* b0 = columns + b * kBlock;
      kMultiply[ma - 1][nb - 1](a, lda_bytes, b0, b0 + kBlock, ldb, steps, c);
      write_out(c, rows, std::min(n - b * kBlock, nb * kBlock), w.bias ? w.bias + co : nullptr,
                out + co * ld + p0 + b * kBlock, ld, accumulate);
    }
  }
  _tile_release();
}

}  // namespace klein::ops::detail
