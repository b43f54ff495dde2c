// AVX2 kernels (with FMA and F16C). Compiled with -mavx2 -mfma -mf16c and called only when the
// CPU has them (quant/matmul.cpp, kernels_for). Where the CPU has AVX-VNNI (Intel since Alder
// Lake and Sapphire Rapids), avx2_kernels() gives the VPDPBUSD tiles of kernels_avxvnni.cpp
// with this file's activation quantizer instead of the tiles below.
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
#include "core/cpu.h"
#include "quant/avx2_tiles.h"
#include "quant/kernel_common.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

constexpr int kIntRows = 4;

inline void pin(__m256i& v) { asm("" : "+x"(v)); }

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
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
    __m256 d, dz;
    q4_scales(t, half, d, dz);
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

const Kernels& avx2_pair_kernels() {
  static const Kernels k{Isa::Avx2, kIntRows, quantize_rows, Tiles::tiles<TileQ8>,
                         Tiles::tiles<TileQ4>};
  return k;
}

const Kernels& avx2_kernels() {
  static const Kernels with_vnni = avx_vnni_kernels(quantize_rows);
  return cpu_features().avx_vnni ? with_vnni : avx2_pair_kernels();
}

}  // namespace klein::quant::detail
