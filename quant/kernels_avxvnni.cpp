// Integer tiles on AVX-VNNI (the VEX form of VPDPBUSD on ymm registers: Intel Alder Lake and
// later client CPUs, Sapphire Rapids, the Sierra Forest class of E-core servers): the AVX-512
// tiles' arithmetic in 8-row halves. One VPDPBUSD multiplies 32 unsigned weight bytes (4
// columns of 8 rows) by 4 activation bytes broadcast to every row and adds 8 int32 row sums,
// where the AVX2 tiles need VPMADDUBSW, VPMADDWD and VPADDD. The sums are exact integers
// either way and the float work after each block is the same operations in the same order,
// so the results are those of the AVX2 tiles bit for bit (tests/quant: AvxVnni.*).
// Compiled with -mavx2 -mfma -mf16c -mavxvnni; chosen by avx2_kernels() where the CPU has it.
#include <immintrin.h>

#include "quant/avx2_tiles.h"
#include "quant/kernel_common.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

// 6 rows: 6 int32 and 6 float accumulators, the weights, their two nibble halves and a
// broadcast fill the 16 ymm registers.
constexpr int kIntRows = 6;
using ActStream = ActStreamOf<kIntRows>;

// Q8: the tile holds q + 128 (unsigned); starting each block's sum from -128·Σx makes the
// total Σ q·x.
template <int R>
void q8_half(ActStream x, const TileQ8* tiles, int64_t nblocks, int half, float* y, int64_t ldy,
             int cols, bool accumulate) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ8& t = tiles[b];
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_set1_epi32(x.neg128_sum[r]);
#pragma GCC unroll 8
    for (int g = 0; g < kBlock / 4; ++g) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.q[g][8 * half]));
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r)
        sum[r] = _mm256_dpbusd_avx_epi32(sum[r], w, broadcast4(x.q + r * kBlock + 4 * g));
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

// Q4: the low nibbles are columns 4g.., the high ones 16 + 4g..; the zero point comes off in
// float with the activations' scaled sums, as in the AVX2 tiles.
template <int R>
void q4_half(ActStream x, const TileQ4* tiles, int64_t nblocks, int half, float* y, int64_t ldy,
             int cols, bool accumulate) {
  const __m256i nibble = _mm256_set1_epi8(15);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b, x.next_block()) {
    const TileQ4& t = tiles[b];
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < kBlock / 8; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.q[g][8 * half]));
      const __m256i lo = _mm256_and_si256(v, nibble);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        sum[r] = _mm256_dpbusd_avx_epi32(sum[r], lo, broadcast4(x.q + r * kBlock + 4 * g));
        sum[r] = _mm256_dpbusd_avx_epi32(sum[r], hi, broadcast4(x.q + r * kBlock + 16 + 4 * g));
      }
    }
    __m256 d, dz;
    q4_scales(t, half, d, dz);
    for (int r = 0; r < R; ++r) {
      const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(x.scale[r]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), dd, acc[r]);
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

Kernels avx_vnni_kernels(QuantizeRowsFn quantize_rows) {
  return Kernels{Isa::Avx2, kIntRows, quantize_rows, Tiles::tiles<TileQ8>, Tiles::tiles<TileQ4>};
}

}  // namespace klein::quant::detail
