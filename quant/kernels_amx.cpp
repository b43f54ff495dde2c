// AMX kernels (Intel Advanced Matrix Extensions, BF16): Y = X W^T for Q8 / Q4 weights (the
// activations rounded to bf16, each weight tile dequantized to bf16) and for BF16 weights (the
// activations split into three bf16 parts, exact); see quant/kernels.h.
// One TDPBF16PS multiplies a 16 x 32 tile of X by a 32 x 16 tile of W^T into 16 x 16 float32
// sums: 8192 multiply-adds per instruction, about 16 times the work of an AVX-512 FMA.
//
// The Interleaved16 weight layout was made for vpdpbusd, but it is one permute away from what
// the tile unit wants. A TileQ8 row of 64 bytes holds columns 4g..4g+3 of all 16 weight rows
// (byte 4r + i = row r, column 4g + i). Converted to bf16 in that order it is 32 dwords, dword
// 2r + j = (column 4g + 2j, column 4g + 2j + 1) of row r: the even dwords are pair row 2g of
// the B tile and the odd dwords pair row 2g + 1. TileQ4 is the same with its low nibbles
// (columns 4g + i) and high nibbles (columns 16 + 4g + i).
#include <immintrin.h>
// GCC 12's intrinsics start some conversions from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstring>

#include "quant/amx_tiles.h"
#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

// Tiles 0-1: A (two 16-row halves of a 32-row block of X); 2-3: B (two weight groups);
// 4-7: C (A half x group), every tile 16 rows of 64 bytes (quant/amx_tiles.h).
void configure() { _tile_loadconfig(&kAmxTileConfig); }

void release() { _tile_release(); }

__m512 bf16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

void rows_to_bf16(const float* x, int64_t ldx, int rows, int kc, int splits, uint16_t* out,
                  int64_t ldo) {
  const int64_t part = int64_t(kAmxBlockRows) * ldo;  // elements per part
  for (int r = 0; r < rows; ++r) {
    const float* src = x + r * ldx;
    uint16_t* dst = out + r * ldo;
    for (int64_t k = 0; k < kc; k += 32) {
      __m512 lo = _mm512_loadu_ps(src + k), hi = _mm512_loadu_ps(src + k + 16);
      for (int s = 0; s < splits; ++s) {
        const __m512i v = __m512i(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst + s * part + k, v);
        if (s + 1 == splits) break;
        // What this part missed, exactly: x and its bf16 rounding share the leading bits.
        lo = _mm512_sub_ps(lo, bf16_to_f32(_mm512_castsi512_si256(v)));
        hi = _mm512_sub_ps(hi, bf16_to_f32(_mm512_extracti64x4_epi64(v, 1)));
      }
    }
  }
  for (int s = 0; s < splits; ++s)
    for (int r = rows; r < kAmxBlockRows; ++r)
      std::memset(out + s * part + r * ldo, 0, size_t(kc) * sizeof(uint16_t));
}

// Lane l of the result is d[4j + l / 4]: the scale of the row that lane l of the j-th 16-byte
// quarter of a tile row belongs to.
__m512 row_scales(__m512 d, int j) {
  const __m512i index = _mm512_add_epi32(
      _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 2),
      _mm512_set1_epi32(4 * j));
  return _mm512_permutexvar_ps(index, d);
}

// 64 unsigned bytes (4r + i = row r, column c0 + i) to two B-tile pair rows at out (c0 / 2)
// and the next: value = scale[r] * byte + offset[r], rounded to bf16.
void bytes_to_pair_rows(__m512i bytes, const __m512 scale[4], const __m512 offset[4],
                        uint16_t* out) {
  // The quarter index must be an immediate (unoptimised and sanitizer builds do not fold a
  // loop counter), hence four spelled-out extractions.
  const __m128i quarter[4] = {
      _mm512_extracti32x4_epi32(bytes, 0), _mm512_extracti32x4_epi32(bytes, 1),
      _mm512_extracti32x4_epi32(bytes, 2), _mm512_extracti32x4_epi32(bytes, 3)};
  __m512 v[4];
  for (int j = 0; j < 4; ++j) {
    const __m512i q = _mm512_cvtepu8_epi32(quarter[j]);
    v[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), scale[j], offset[j]);
  }
  const __m512i rows0_7 = __m512i(_mm512_cvtne2ps_pbh(v[1], v[0]));
  const __m512i rows8_15 = __m512i(_mm512_cvtne2ps_pbh(v[3], v[2]));
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  _mm512_storeu_si512(out, _mm512_permutex2var_epi32(rows0_7, even, rows8_15));
  _mm512_storeu_si512(out + 32, _mm512_permutex2var_epi32(rows0_7, odd, rows8_15));
}

// w = d * (q - 128).
void tile_q8_to_bf16(const TileQ8& t, uint16_t* out) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.scale)));
  __m512 scale[4], offset[4];
  for (int j = 0; j < 4; ++j) {
    scale[j] = row_scales(d, j);
    offset[j] = _mm512_mul_ps(scale[j], _mm512_set1_ps(-128.0f));
  }
  for (int g = 0; g < kBlock / 4; ++g)
    bytes_to_pair_rows(_mm512_loadu_si512(t.q[g]), scale, offset, out + g * 64);
}

// w = d * (q - z), d = q4_scale(code) (the code is the f16 bit pattern shifted right by 7, then
// times 2^-8), z = zero / 16.
void tile_q4_to_bf16(const TileQ4& t, uint16_t* out) {
  const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.scale));
  const __m256i f16_bits = _mm256_slli_epi16(_mm256_cvtepu8_epi16(codes), 7);
  const __m512 d = _mm512_mul_ps(_mm512_cvtph_ps(f16_bits), _mm512_set1_ps(kQ4ScaleFactor));
  const __m512 z = _mm512_mul_ps(
      _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(t.zero)))),
      _mm512_set1_ps(1.0f / 16.0f));
  const __m512 dz = _mm512_mul_ps(d, z);
  __m512 scale[4], offset[4];
  for (int j = 0; j < 4; ++j) {
    scale[j] = row_scales(d, j);
    offset[j] = _mm512_sub_ps(_mm512_setzero_ps(), row_scales(dz, j));
  }
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  for (int g = 0; g < kBlock / 8; ++g) {
    const __m512i q = _mm512_loadu_si512(t.q[g]);
    bytes_to_pair_rows(_mm512_and_si512(q, low_nibbles), scale, offset, out + g * 64);
    bytes_to_pair_rows(_mm512_and_si512(_mm512_srli_epi16(q, 4), low_nibbles), scale, offset,
                       out + (8 + 2 * g) * 32);
  }
}

void q8_tiles_to_bf16(const TileQ8* tiles, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; ++i, out += kAmxTileElements) tile_q8_to_bf16(tiles[i], out);
}

void q4_tiles_to_bf16(const TileQ4* tiles, int64_t count, uint16_t* out) {
  for (int64_t i = 0; i < count; ++i, out += kAmxTileElements) tile_q4_to_bf16(tiles[i], out);
}

constexpr int64_t kTileStride = 64;  // bytes per row of a B tile

// Runs the pieces of a side work a few per step, so that `steps` steps run them all.
class SideWork {
 public:
  SideWork(const AmxSideWork* work, int64_t steps)
      : work_(work), end_(work ? work->pieces : 0),
        per_step_(steps > 0 ? (end_ + steps - 1) / steps : end_) {}

  void step() {
    for (int64_t i = 0; i < per_step_ && next_ < end_; ++i) work_->run(work_->context, next_++);
  }
  void finish() {
    while (next_ < end_) work_->run(work_->context, next_++);
  }

 private:
  const AmxSideWork* work_;
  int64_t next_ = 0, end_, per_step_;
};

// C tiles 4-7 over groups 1 or 2: out = c (or 0) + sum_s A_s B^T.
void block(const uint16_t* a, int64_t lda, int splits, const uint16_t* b0, const uint16_t* b1,
           int groups, int64_t nb, const float* c, int64_t ldc, float* out, int64_t ldo,
           const AmxSideWork* side_work) {
  SideWork side(side_work, nb);
  const int64_t a_stride = lda * int64_t(sizeof(uint16_t));
  const int64_t c_stride = ldc * int64_t(sizeof(float));
  const int64_t o_stride = ldo * int64_t(sizeof(float));
  const int64_t part = int64_t(kAmxBlockRows) * lda;
  if (c) {
    _tile_loadd(4, c, c_stride);
    _tile_loadd(6, c + 16 * ldc, c_stride);
  } else {
    _tile_zero(4);
    _tile_zero(6);
  }
  if (groups == 2) {
    if (c) {
      _tile_loadd(5, c + 16, c_stride);
      _tile_loadd(7, c + 16 * ldc + 16, c_stride);
    } else {
      _tile_zero(5);
      _tile_zero(7);
    }
    for (int64_t b = 0; b < nb; ++b) {
      _tile_loadd(2, b0 + b * kAmxTileElements, kTileStride);
      _tile_loadd(3, b1 + b * kAmxTileElements, kTileStride);
      for (int s = 0; s < splits; ++s) {
        const uint16_t* as = a + s * part + b * kBlock;
        _tile_loadd(0, as, a_stride);
        _tile_loadd(1, as + 16 * lda, a_stride);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(6, 1, 2);
        _tile_dpbf16ps(7, 1, 3);
      }
      side.step();
    }
    _tile_stored(5, out + 16, o_stride);
    _tile_stored(7, out + 16 * ldo + 16, o_stride);
  } else {
    for (int64_t b = 0; b < nb; ++b) {
      _tile_loadd(2, b0 + b * kAmxTileElements, kTileStride);
      for (int s = 0; s < splits; ++s) {
        const uint16_t* as = a + s * part + b * kBlock;
        _tile_loadd(0, as, a_stride);
        _tile_loadd(1, as + 16 * lda, a_stride);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(6, 1, 2);
      }
      side.step();
    }
  }
  side.finish();
  _tile_stored(4, out, o_stride);
  _tile_stored(6, out + 16 * ldo, o_stride);
}

}  // namespace

const AmxKernels& amx_kernels() {
  static const AmxKernels k{configure, release, rows_to_bf16, q8_tiles_to_bf16, q4_tiles_to_bf16,
                            block};
  return k;
}

}  // namespace klein::quant::detail
