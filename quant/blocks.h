#pragma once
// Quantized weight formats: the bytes of every block, what they mean, and the scalar
// reference that defines them (quantize, dequantize, dot). SIMD kernels live elsewhere
// (quant/kernels_*.cpp) and are tested against these functions.
//
// A weight matrix W[N, K] is cut along K into blocks of kBlock = 32 weights; every block has
// its own scale. K is always a multiple of 32 in this model.
//
// Two arrangements of the same blocks (quant/matmul.h, Layout):
//   RowMajor       row n is K/32 consecutive BlockQ8 / BlockQ4 (the obvious format).
//   Interleaved16  16 rows at a time: for rows [16g, 16g+16) the K/32 tiles TileQ8 / TileQ4
//                  follow each other; a tile holds one 32-column block of all 16 rows, laid
//                  out so that one 64-byte vector load gives 4 consecutive columns of 16 rows
//                  (what an int8 dot-product instruction with a broadcast activation wants).
//                  The last group is padded with zero rows.
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace klein::quant {

constexpr int kBlock = 32;     // weights per block along K
constexpr int kTileRows = 16;  // rows per tile in the Interleaved16 layout

// ---- Q8: symmetric int8, f16 scale ---------------------------------------------------------
// w[i] = d * q[i], d = max|w| / 127 (stored as f16), q in [-127, 127].
// 34 bytes per 32 weights = 8.5 bits per weight.
struct BlockQ8 {
  uint16_t scale;  // d, f16
  int8_t q[kBlock];
};
static_assert(sizeof(BlockQ8) == 34);

// ---- Q4: asymmetric 4-bit, 8-bit scale and 8-bit zero point --------------------------------
// w[i] = d * (q[i] - z), q in [0, 15], d = q4_scale(scale code), z = zero / 16 in [0, 15.94].
// 18 bytes per 32 weights = 4.5 bits per weight: the size of a plain "4-bit + f16 scale"
// block, but the two bytes buy an offset instead of a more precise scale. On Gaussian to
// Student-t(3) weights this lowers the RMS error by 11% to 25% against a symmetric 4-bit block
// with an f16 scale and an error-minimising scale search (measured: tests/quant, Q4 RMSE), and
// comes within 4% of an f16 scale plus f16 minimum (5 bits per weight).
//
// The scale code is an unsigned 8-bit float with 5 exponent and 3 mantissa bits: the bits of
// an f16 after its sign bit (f16 bits = code << 7), times 2^-8. It covers 2^-25 .. 240, so
// blocks with max|w| up to ~3500 are representable; a 3-bit mantissa is enough because the
// quantizer picks q and z for the rounded scale.
// q[j] holds element j in its low nibble and element j + 16 in its high nibble.
struct BlockQ4 {
  uint8_t scale;  // d code (q4_scale)
  uint8_t zero;   // z * 16
  uint8_t q[kBlock / 2];
};
static_assert(sizeof(BlockQ4) == 18);

constexpr uint8_t kQ4MaxScaleCode = 247;  // 0xF8 and up would be f16 inf/NaN
constexpr float kQ4ScaleFactor = 1.0f / 256.0f;

inline float q4_scale(uint8_t code) { return f16_to_f32(uint16_t(code << 7)) * kQ4ScaleFactor; }
// The code whose scale is nearest to d (d >= 0), saturating at the largest code.
uint8_t q4_scale_code(float d);

// ---- Tiles of the Interleaved16 layout ----------------------------------------------------
// TileQ8: rows r = 0..15 of one 32-column block.
//   scale[r]      f16 d of row r
//   q[g][r][i]    q + 128 (unsigned) of row r, column 4g + i
// w = d * (q[g][r][i] - 128). Storing q biased to unsigned lets the x86 kernels feed the
// weights to vpdpbusd (unsigned x signed bytes) without a fix-up per load.
// 544 bytes per 16 x 32 weights = 8.5 bits per weight.
struct TileQ8 {
  uint16_t scale[kTileRows];
  uint8_t q[kBlock / 4][kTileRows][4];
};
static_assert(sizeof(TileQ8) == 544);

// TileQ4: rows r = 0..15 of one 32-column block.
//   scale[r], zero[r]  as in BlockQ4
//   q[g][r][i]         low nibble: row r, column 4g + i; high nibble: row r, column 16 + 4g + i
// One 64-byte vector holds columns 4g..4g+3 (low nibbles) and 16+4g..16+4g+3 (high nibbles)
// of all 16 rows, so a mask and a shift give two vectors ready for vpdpbusd / sdot.
// 288 bytes per 16 x 32 weights = 4.5 bits per weight.
struct TileQ4 {
  uint8_t scale[kTileRows];
  uint8_t zero[kTileRows];
  uint8_t q[kBlock / 8][kTileRows][4];
};
static_assert(sizeof(TileQ4) == 288);

// ---- Scalar reference ----------------------------------------------------------------------
// Round to nearest, ties to even, for |v| < 2^22: what the vector conversions (cvtps2dq,
// fcvtns) do, without the libm call behind std::nearbyint (which saves and restores the
// floating-point environment and made quantization 20x slower).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it leaves no fraction bits
  return (v + kMagic) - kMagic;
}

// n is a multiple of kBlock everywhere. Quantizers are deterministic: the same floats give
// the same bytes on every machine (the vector forms of the Q4 search below compute the same
// float operations in the same order, and the files that hold them are compiled without
// contraction into fused multiply-adds).
void quantize_q8(const float* x, BlockQ8* out, int64_t n);
void quantize_q8_scalar(const float* x, BlockQ8* out, int64_t n);  // the reference
void dequantize_q8(const BlockQ8* in, float* out, int64_t n);
void quantize_q4(const float* x, BlockQ4* out, int64_t n);
void quantize_q4_scalar(const float* x, BlockQ4* out, int64_t n);  // the scalar search
void dequantize_q4(const BlockQ4* in, float* out, int64_t n);

// The scale of every Q4 scale code and its reciprocal (0 for code 0): q4_scale(code) and
// 1.0f / q4_scale(code), so that the search neither converts f16 nor divides per candidate.
struct Q4ScaleTable {
  float d[256], inv_d[256];
};
const Q4ScaleTable& q4_scale_table();

// The Q4 search's inner loop: the squared error of one block x[0..31] quantized with each of
// n candidate (d, 1/d, z), as
//   q = round_even(clamp(x * inv_d + z, 0, 15)),  e = sum over i of (x - d * (q - z))^2
// summed in eight partial sums (element i into sum i % 8, then ((0+1)+(2+3))+((4+5)+(6+7))).
// Chosen at run time: AVX-512 (16 candidates a vector), AVX2 (8) or scalar, all giving the
// same bits (tests/quant compares them).
void q4_trial_errors(const float* x, const float* d, const float* inv_d, const float* z, int n,
                     float* err);
void q4_trial_errors_scalar(const float* x, const float* d, const float* inv_d, const float* z,
                            int n, float* err);
// The 16 bytes of levels of one Q4 block: element i in the low nibble of byte i, element
// i + 16 in the high one, each round_even(clamp(x * inv_d + z, 0, 15)).
void q4_levels(const float* x, float inv_d, float z, uint8_t* q);
void q4_levels_scalar(const float* x, float inv_d, float z, uint8_t* q);
#if defined(KLEIN_X86)
// Callable only when the CPU has the instructions (cpu_features()).
void q4_levels_avx512(const float* x, float inv_d, float z, uint8_t* q);
void quantize_q8_avx512(const float* x, BlockQ8* out, int64_t n);
// The whole Q4 search on AVX-512: the candidates' set-up and choice in lanes as well as
// their errors; the bytes of quantize_q4_scalar.
void quantize_q4_avx512(const float* x, BlockQ4* out, int64_t n);
void q4_trial_errors_avx2(const float* x, const float* d, const float* inv_d, const float* z,
                          int n, float* err);
// The Q4 search with its candidates' set-up in lanes (the choice stays scalar).
void quantize_q4_avx2(const float* x, BlockQ4* out, int64_t n);
void q4_trial_errors_avx512(const float* x, const float* d, const float* inv_d, const float* z,
                            int n, float* err);
#endif

// One 16-row tile from 16 row blocks (rows[r] may be null: a zero padding row), and back.
void make_tile_q8(const BlockQ8* const rows[kTileRows], TileQ8* out);
void make_tile_q4(const BlockQ4* const rows[kTileRows], TileQ4* out);
BlockQ8 tile_row_q8(const TileQ8& tile, int r);
BlockQ4 tile_row_q4(const TileQ4& tile, int r);

// Dot products of one quantized row (n weights) with float32 activations, accumulated in
// double: the exact value of sum_i dequantize(w)[i] * x[i] up to one final rounding.
double dot_q8(const BlockQ8* w, const float* x, int64_t n);
double dot_q4(const BlockQ4* w, const float* x, int64_t n);
double dot_f32(const float* w, const float* x, int64_t n);
double dot_bf16(const uint16_t* w, const float* x, int64_t n);
double dot_f16(const uint16_t* w, const float* x, int64_t n);

}  // namespace klein::quant
