// AVX-512 kernels (F, BW, VL, DQ, VNNI; F16C for f16 weights). Compiled with the AVX-512 flags
// and called only when the CPU has them (quant/matmul.cpp, kernels_for).
//
// Integer tiles: a 64-byte weight vector holds 4 columns of 16 rows; vpdpbusd multiplies it by
// 4 activation bytes broadcast from memory and adds 16 int32 row sums, so a tile of 16 rows x
// 32 columns is 8 instructions per activation row. Up to 12 activation rows share each weight
// load; their 12 int32 and 12 float accumulators fill 24 of the 32 registers.
// GCC 12 reports its own intrinsics' deliberately undefined vectors (_mm512_undefined_*) as
// uninitialized once they are inlined here; the warnings are about the header, not this file.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/kernel_common.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

constexpr int kIntRows = 12;

inline __m512i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

inline __mmask16 low_mask(int n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }

// Writes (or adds to) the first `cols` of 16 outputs.
inline void store_row(float* y, __m512 v, int cols, bool accumulate) {
  const __mmask16 m = low_mask(cols);
  if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, y));
  _mm512_mask_storeu_ps(y, m, v);
}

// Writes (or adds to) the first `cols` of 16 outputs in each of R rows. All loads come before
// any store: rows of Y are often a multiple of 4 KiB apart, and a load behind a store to the
// same offset within a page waits for that store.
template <int R>
inline void store_rows(float* y, int64_t ldy, __m512 (&acc)[R], int cols, bool accumulate) {
  const __mmask16 m = low_mask(cols);
  if (accumulate)
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], _mm512_maskz_loadu_ps(m, y + r * ldy));
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + r * ldy, m, acc[r]);
}

// ---- Activations ---------------------------------------------------------------------------

void quantize_rows(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K,
                   const ActBlocks& act) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const float* xb = x + m * ldx + b * kBlock;
      const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
      const __m512 a = _mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1));
      const float amax = _mm512_reduce_max_ps(a);
      const float d = amax / 127.0f;
      const __m512 inv_d = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      // cvtps2dq rounds to nearest even (the default MXCSR mode), like the scalar definition.
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, inv_d));
      const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, inv_d));
      const int64_t e = act.entry(m, b);
      int8_t* q = act.q + e * kBlock;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q1));
      const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      store_block_sums(act, e, d, sum);
    }
  }
}

using ActStream = ActStreamOf<kIntRows>;

// ---- Q8 tiles ------------------------------------------------------------------------------

template <int R>
void tiles_q8_rows(ActStream x, const TileQ8* tiles, int64_t nblocks, float* y, int64_t ldy,
                   int cols, bool accumulate) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ8& t = tiles[b];
    __m512i sum[R];
    // The tile holds q + 128; starting from -128 * sum(x) makes the total sum(q * x).
    for (int r = 0; r < R; ++r) sum[r] = _mm512_set1_epi32(x.neg128_sum[r]);
#pragma GCC unroll 8
    for (int g = 0; g < kBlock / 4; ++g) {
      const __m512i w = _mm512_loadu_si512(t.q[g]);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r)
        sum[r] = _mm512_dpbusd_epi32(sum[r], w, broadcast4(x.q + r * kBlock + 4 * g));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.scale)));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(x.scale[r]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), dd, acc[r]);
    }
  }
  store_rows<R>(y, ldy, acc, cols, accumulate);
}

// ---- Q4 tiles ------------------------------------------------------------------------------

template <int R>
void tiles_q4_rows(ActStream x, const TileQ4* tiles, int64_t nblocks, float* y, int64_t ldy,
                   int cols, bool accumulate) {
  const __m512i nibble = _mm512_set1_epi8(15);
  const __m512 scale_factor = _mm512_set1_ps(kQ4ScaleFactor);
  const __m512 sixteenth = _mm512_set1_ps(0.0625f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ4& t = tiles[b];
    __m512i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < kBlock / 8; ++g) {
      const __m512i v = _mm512_loadu_si512(t.q[g]);
      const __m512i lo = _mm512_and_si512(v, nibble);                         // columns 4g..
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);  // columns 16+4g..
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        sum[r] = _mm512_dpbusd_epi32(sum[r], lo, broadcast4(x.q + r * kBlock + 4 * g));
        sum[r] = _mm512_dpbusd_epi32(sum[r], hi, broadcast4(x.q + r * kBlock + 16 + 4 * g));
      }
    }
    // Scale codes are the f16 bits >> 7: widen, shift back, convert, times 2^-8.
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.scale));
    const __m512 d = _mm512_mul_ps(
        _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 7)), scale_factor);
    const __m128i zeros = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.zero));
    const __m512 dz = _mm512_mul_ps(d, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(zeros)),
                                                     sixteenth));
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 dd = _mm512_mul_ps(d, _mm512_set1_ps(x.scale[r]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), dd, acc[r]);
      acc[r] = _mm512_fnmadd_ps(dz, _mm512_set1_ps(x.scaled_sum[r]), acc[r]);
    }
  }
  store_rows<R>(y, ldy, acc, cols, accumulate);
}

// Row counts 1..12 as compile-time constants, so accumulators live in registers.
template <int R>
struct Rows {
  static void run(const ActStream& x, const TileQ8* tiles, int64_t nblocks, float* y, int64_t ldy,
                  int cols, bool accumulate) {
    tiles_q8_rows<R>(x, tiles, nblocks, y, ldy, cols, accumulate);
  }
  static void run(const ActStream& x, const TileQ4* tiles, int64_t nblocks, float* y, int64_t ldy,
                  int cols, bool accumulate) {
    tiles_q4_rows<R>(x, tiles, nblocks, y, ldy, cols, accumulate);
  }
};
using Tiles = RowKernels<kIntRows, Rows>;

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{Isa::Avx512, kIntRows, quantize_rows, Tiles::tiles<TileQ8>,
                         Tiles::tiles<TileQ4>};
  return k;
}

}  // namespace klein::quant::detail
