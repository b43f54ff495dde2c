#pragma once
// Element types of tensors on disk and in memory, and the scalar conversions between them.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace klein {

enum class DType : uint8_t {
  F32,
  F16,
  BF16,
  Q8,   // int8 blocks with a scale (layout: quant/blocks.h)
  Q4,   // 4-bit blocks with a scale (layout: quant/blocks.h)
  I64,
  I32,
  U8,
  GGML,  // a GGML block type read from a GGUF file (formats/gguf_types.h); the type id is in
         // the weight's layout byte. Only converting reads it (decoded to float32 per row).
  F8_E4M3,  // 8-bit float, OCP "E4M3FN": bias 7, subnormals, no infinities, S.1111.111 is NaN
  F8_E5M2,  // 8-bit float, IEEE-like: bias 15, subnormals, infinities and NaNs
};

std::string_view dtype_name(DType t);
// Bytes per element for plain types; 0 for block-quantized types (see quant/blocks.h).
size_t dtype_size(DType t);
bool dtype_is_float(DType t);  // F32, F16 or BF16
bool dtype_is_fp8(DType t);    // F8_E4M3 or F8_E5M2

// The exact value of an 8-bit float code (every fp8 value is a float32 value).
float f8_e4m3_to_f32(uint8_t code);
float f8_e5m2_to_f32(uint8_t code);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);  // round to nearest even, overflow to inf

// Bulk conversions, vectorised (chosen at run time from the CPU's features).
void bf16_to_f32(const uint16_t* src, float* dst, size_t n);
void f16_to_f32(const uint16_t* src, float* dst, size_t n);
void f32_to_bf16(const float* src, uint16_t* dst, size_t n);
void f32_to_f16(const float* src, uint16_t* dst, size_t n);
// Any float type (F32, F16, BF16, F8_E4M3, F8_E5M2) to float32, exactly.
void to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace klein
