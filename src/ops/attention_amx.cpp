// Attention on AMX tiles (compiled with -mamx-tile -mamx-bf16; called only when the CPU and
// the OS allow it): Q·Kᵀ and P·V as bf16 tile products with float32 sums, the softmax in
// float32 between them (attention_avx512.cpp), P rounded to bf16.
//
// Tiles 0-1 hold A (two 16-row halves of 32 rows of Q or P), 2-3 B (two key blocks for
// Q·Kᵀ, two 16-column blocks of V for P·V), 4-7 C (A half x B block). Each step loads four
// tiles for four TDPBF16PS, like the matmul kernels in quant/kernels_amx.cpp.
#include <immintrin.h>
// GCC 12's intrinsics start some conversions from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>
#include <cstring>

#include "quant/amx_tiles.h"
#include "ops/attention_bf16_task.h"
#include "ops/attention_kernels.h"

namespace klein::ops::detail {

namespace {

constexpr int64_t kTileBytes = 64;  // bytes per row of a packed B tile

// Not std::min: no shared template instance may be compiled with this file's flags.
int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__m512i bf16_pair(const float* lo, const float* hi) {
  return __m512i(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo)));
}

// r[i][j] <- r[j][i] for 16 rows of 16 dwords.
void transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + 4 + j], 0x88);
      t[i + 4 + j] = _mm512_shuffle_i32x4(r[i + j], r[i + 4 + j], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
  }
}

// scores[0:32, 0:cols) = Q block (32 rows of qb) · keys [k0, k0 + cols)ᵀ, cols a multiple of 32.
void score_tiles(const uint16_t* qb, const uint16_t* keys, int64_t k0, int64_t cols, int64_t D,
                 float* scores, int64_t ld) {
  const int64_t chunks = D / 32, q_stride = D * int64_t(sizeof(uint16_t));
  const int64_t s_stride = ld * int64_t(sizeof(float));
  const uint16_t* q1 = qb + 16 * D;
  for (int64_t j = 0; j < cols; j += 32) {
    const uint16_t* b0 = keys + ((k0 + j) / 16) * chunks * kAmxTileElements;
    const uint16_t* b1 = b0 + chunks * kAmxTileElements;
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(0, qb + 32 * c, q_stride);
      _tile_loadd(1, q1 + 32 * c, q_stride);
      _tile_loadd(2, b0 + c * kAmxTileElements, kTileBytes);
      _tile_loadd(3, b1 + c * kAmxTileElements, kTileBytes);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    _tile_stored(4, scores + j, s_stride);
    _tile_stored(5, scores + j + 16, s_stride);
    _tile_stored(6, scores + 16 * ld + j, s_stride);
    _tile_stored(7, scores + 16 * ld + j + 16, s_stride);
  }
}

// acc[0:32, 0:D) += P [32, cols) · values [k0, k0 + cols), cols a multiple of 32.
void value_tiles(const uint16_t* p, int64_t ldp, const uint16_t* values, int64_t k0,
                 int64_t cols, int64_t D, float* acc) {
  const int64_t blocks = D / 16, p_stride = ldp * int64_t(sizeof(uint16_t));
  const int64_t a_stride = D * int64_t(sizeof(float));
  const uint16_t* p1 = p + 16 * ldp;
  float* acc1 = acc + 16 * D;
  const uint16_t* v0 = values + (k0 / 32) * blocks * kAmxTileElements;
  for (int64_t n = 0; n < blocks; n += 2) {
    _tile_loadd(4, acc + 16 * n, a_stride);
    _tile_loadd(5, acc + 16 * n + 16, a_stride);
    _tile_loadd(6, acc1 + 16 * n, a_stride);
    _tile_loadd(7, acc1 + 16 * n + 16, a_stride);
    const uint16_t* b = v0 + n * kAmxTileElements;
    for (int64_t j = 0; j < cols; j += 32, b += blocks * kAmxTileElements) {
      _tile_loadd(0, p + j, p_stride);
      _tile_loadd(1, p1 + j, p_stride);
      _tile_loadd(2, b, kTileBytes);
      _tile_loadd(3, b + kAmxTileElements, kTileBytes);
      _tile_dpbf16ps(4, 0, 2);
      _tile_dpbf16ps(5, 0, 3);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
    _tile_stored(4, acc + 16 * n, a_stride);
    _tile_stored(5, acc + 16 * n + 16, a_stride);
    _tile_stored(6, acc1 + 16 * n, a_stride);
    _tile_stored(7, acc1 + 16 * n + 16, a_stride);
  }
}

}  // namespace

void pack_amx(const AmxPack& g, int64_t row0, int64_t row1) {
  const int64_t D = g.head_dim, chunks = D / 32, blocks = D / 16;
  const __m512i zero = _mm512_setzero_si512();
  // Keys: the 16 dwords (dim pairs) of key n in chunk c are column n of the tile, so a block
  // of 16 keys is a 16 x 16 dword transpose.
  for (int64_t b = row0 / 16; b < min64(row1, g.kv_padded) / 16; ++b)
    for (int64_t h = 0; h < g.kv_heads; ++h) {
      uint16_t* tiles = g.keys + h * g.kv_stride + b * chunks * kAmxTileElements;
      for (int64_t c = 0; c < chunks; ++c) {
        __m512i r[16];
        for (int64_t n = 0; n < 16; ++n) {
          const float* row = g.k + (16 * b + n) * g.ldk + h * D + 32 * c;
          r[n] = 16 * b + n < g.kv_len ? bf16_pair(row, row + 16) : zero;
        }
        transpose16x16(r);
        for (int64_t p = 0; p < 16; ++p)
          _mm512_storeu_si512(tiles + c * kAmxTileElements + 32 * p, r[p]);
      }
    }
  // Values: pair row p of the tile for dims [16n, 16n + 16) interleaves keys 2p and 2p + 1.
  const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                              24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17,
                                              1, 16, 0);
  for (int64_t kc = row0 / 32; kc < min64(row1, g.kv_padded) / 32; ++kc)
    for (int64_t p = 0; p < 16; ++p) {
      const int64_t r0 = 32 * kc + 2 * p, r1 = r0 + 1;
      for (int64_t h = 0; h < g.kv_heads; ++h) {
        uint16_t* tiles = g.values + h * g.kv_stride + kc * blocks * kAmxTileElements + 32 * p;
        const float* a = g.v + r0 * g.ldv + h * D;
        const float* b = a + g.ldv;
        for (int64_t n = 0; n < blocks; ++n) {
          const __m512 va = r0 < g.kv_len ? _mm512_loadu_ps(a + 16 * n) : _mm512_setzero_ps();
          const __m512 vb = r1 < g.kv_len ? _mm512_loadu_ps(b + 16 * n) : _mm512_setzero_ps();
          const __m512i both = __m512i(_mm512_cvtne2ps_pbh(vb, va));
          _mm512_storeu_si512(tiles + n * kAmxTileElements,
                              _mm512_permutexvar_epi16(interleave, both));
        }
      }
    }
  // Queries: rows of bf16, [q_padded, D] per head.
  const int64_t q_heads = g.kv_heads * g.group;
  for (int64_t r = row0; r < min64(row1, g.q_padded); ++r)
    for (int64_t h = 0; h < q_heads; ++h) {
      uint16_t* out = g.queries + h * g.q_stride + r * D;
      const float* row = g.q + r * g.ldq + h * D;
      for (int64_t d = 0; d < D; d += 32)
        _mm512_storeu_si512(out + d, r < g.q_len ? bf16_pair(row + d, row + d + 16) : zero);
    }
}

void attend_amx(const AmxTask& t) {
  _tile_loadconfig(&quant::kAmxTileConfig);
  attend_bf16_task(t, score_tiles, value_tiles);
  _tile_release();
}

}  // namespace klein::ops::detail
