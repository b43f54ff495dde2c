#pragma once
// What the AVX2-class integer tiles share (kernels_avx2.cpp: VPMADDUBSW pairs; and
// kernels_avxvnni.cpp: VPDPBUSD on ymm): broadcasting 4 activation bytes and writing a tile's
// 8-column halves. Include only from files compiled with -mavx2; internal linkage.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/avx2.h"
#include "quant/blocks.h"

namespace klein::quant::detail {
namespace {

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
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

// The scale d and the scaled zero point d·z/16 of 8 rows of a Q4 tile (rows 8·half ...):
// scale codes are the f16 bits >> 7: widen, shift back, convert, times 2^-8.
inline void q4_scales(const TileQ4& t, int half, __m256& d, __m256& dz) {
  const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.scale + 8 * half));
  d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(codes), 7)),
                    _mm256_set1_ps(kQ4ScaleFactor));
  const __m128i zeros8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t.zero + 8 * half));
  dz = _mm256_mul_ps(
      d, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(zeros8)), _mm256_set1_ps(0.0625f)));
}

}  // namespace
}  // namespace klein::quant::detail
