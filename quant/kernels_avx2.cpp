// AVX2 kernels (with FMA and F16C). Compiled with -mavx2 -mfma -mf16c and called only when the
// CPU has them (quant/matmul.cpp, kernels_for).
//
// Integer tiles without VNNI: pmaddubsw multiplies unsigned by signed bytes into pairs of
// int16 sums, pmaddwd against ones widens them to the int32 row sums. A 16-row tile is two
// 8-row halves of 32 bytes per 4 columns; each half is done on its own to stay within 16
// registers.
//
// The integer sums are pinned to registers as they are updated (pin): integer addition is
// associative, and left to itself the compiler regroups a block's products into trees that
// need more than 16 registers, spilling partial sums and the float accumulators to the stack
// (Q4 matmuls took 1.3x as long).
#include <immintrin.h>

#include <cstring>

#include "core/avx2.h"
#include "quant/kernel_common.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

constexpr int kIntRows = 4;

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline void pin(__m256i& v) { asm("" : "+x"(v)); }

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Writes (or adds to) the first `cols` (0..8) of 8 outputs.
inline void store8(float* y, __m256 v, int cols, bool accumulate) {
  if (cols >= 8) {
    if (accumulate) v = _mm256_add_ps(v, _mm256_loadu_ps(y));
    _mm256_storeu_ps(y, v);
  } else if (cols > 0) {
    const __m256i m = lane_mask(cols);
    if (accumulate) v = _mm256_add_ps(v, _mm256_maskload_ps(y, m));
    _mm256_maskstore_ps(y, m, v);
  }
}

// store8 for R rows, with all loads before any store: rows of Y are often a multiple of 4 KiB
// apart, and a load behind a store to the same offset within a page waits for that store.
template <int R>
inline void store8_rows(float* y, int64_t ldy, __m256 (&acc)[R], int cols, bool accumulate) {
  if (cols <= 0) return;
  if (cols < 8) {
    for (int r = 0; r < R; ++r) store8(y + r * ldy, acc[r], cols, accumulate);
    return;
  }
  if (accumulate)
    for (int r = 0; r < R; ++r) acc[r] = _mm256_add_ps(acc[r], _mm256_loadu_ps(y + r * ldy));
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * ldy, acc[r]);
}

// ---- Activations ---------------------------------------------------------------------------

void quantize_rows(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K,
                   const ActBlocks& act) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // packs_epi32 / packs_epi16 interleave the 128-bit lanes; this puts the bytes back in order.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const float* xb = x + m * ldx + b * kBlock;
      __m256 v[4];
      __m256 a = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(xb + 8 * i);
        a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
      }
      const float amax = hmax(a);
      const float d = amax / 127.0f;
      const __m256 inv_d = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      __m256i q[4];
      for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv_d));
      const __m256i sum =
          _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      const __m256i q16 =
          _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      const int64_t e = act.entry(m, b);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(act.q + e * kBlock),
                          _mm256_permutevar8x32_epi32(q16, unshuffle));
      const int32_t s = hsum_epi32(sum);
      store_block_sums(act, e, d, s);
    }
  }
}

using ActStream = ActStreamOf<kIntRows>;

// ---- Q8 tiles ------------------------------------------------------------------------------

// One 8-row half of the tiles. The weights are turned back into signed bytes; pmaddubsw wants
// one unsigned operand, so it gets |w| and the activations take w's sign (psignb), which keeps
// every pair sum within int16 (2 * 127 * 127).
template <int R>
void q8_half(ActStream x, const TileQ8* tiles, int64_t nblocks, int half, float* y, int64_t ldy,
             int cols, bool accumulate) {
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ8& t = tiles[b];
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int g = 0; g < kBlock / 4; ++g) {
      const __m256i w = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.q[g][8 * half])), bias);
      const __m256i w_abs = _mm256_abs_epi8(w);
      for (int r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(broadcast4(x.q + r * kBlock + 4 * g), w);
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), ones));
        pin(sum[r]);
      }
    }
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.scale + 8 * half)));
    for (int r = 0; r < R; ++r) {
      const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(x.scale[r]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), dd, acc[r]);
    }
  }
  store8_rows<R>(y + 8 * half, ldy, acc, cols - 8 * half, accumulate);
}

// ---- Q4 tiles ------------------------------------------------------------------------------

// One 8-row half. Nibbles (0..15) times int8 stay small enough to add all eight pmaddubsw
// results of a block in int16 (8 * 2 * 15 * 127 < 32768) before widening once.
template <int R>
void q4_half(ActStream x, const TileQ4* tiles, int64_t nblocks, int half, float* y, int64_t ldy,
             int cols, bool accumulate) {
  const __m256i nibble = _mm256_set1_epi8(15);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ4& t = tiles[b];
    __m256i sum16[R];
    for (int r = 0; r < R; ++r) sum16[r] = _mm256_setzero_si256();
    for (int g = 0; g < kBlock / 8; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.q[g][8 * half]));
      const __m256i lo = _mm256_and_si256(v, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      for (int r = 0; r < R; ++r) {
        const __m256i p =
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast4(x.q + r * kBlock + 4 * g)),
                             _mm256_maddubs_epi16(hi, broadcast4(x.q + r * kBlock + 16 + 4 * g)));
        sum16[r] = _mm256_add_epi16(sum16[r], p);
        pin(sum16[r]);
      }
    }
    // Scale codes are the f16 bits >> 7: widen, shift back, convert, times 2^-8.
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.scale + 8 * half));
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(codes), 7)),
                                   _mm256_set1_ps(kQ4ScaleFactor));
    const __m128i zeros8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.zero + 8 * half));
    const __m256 dz = _mm256_mul_ps(
        d,
        _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zeros8)), _mm256_set1_ps(0.0625f)));
    for (int r = 0; r < R; ++r) {
      const __m256i sum = _mm256_madd_epi16(sum16[r], ones);
      const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(x.scale[r]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), dd, acc[r]);
      acc[r] = _mm256_fnmadd_ps(dz, _mm256_set1_ps(x.scaled_sum[r]), acc[r]);
    }
  }
  store8_rows<R>(y + 8 * half, ldy, acc, cols - 8 * half, accumulate);
}

template <int R>
struct Rows {
  static void run(const ActStream& x, const TileQ8* tiles, int64_t nblocks, float* y, int64_t ldy,
                  int cols, bool accumulate) {
    q8_half<R>(x, tiles, nblocks, 0, y, ldy, cols, accumulate);
    if (cols > 8) q8_half<R>(x, tiles, nblocks, 1, y, ldy, cols, accumulate);
  }
  static void run(const ActStream& x, const TileQ4* tiles, int64_t nblocks, float* y, int64_t ldy,
                  int cols, bool accumulate) {
    q4_half<R>(x, tiles, nblocks, 0, y, ldy, cols, accumulate);
    if (cols > 8) q4_half<R>(x, tiles, nblocks, 1, y, ldy, cols, accumulate);
  }
};
using Tiles = RowKernels<kIntRows, Rows>;

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{Isa::Avx2, kIntRows, quantize_rows, Tiles::tiles<TileQ8>,
                         Tiles::tiles<TileQ4>};
  return k;
}

}  // namespace klein::quant::detail
