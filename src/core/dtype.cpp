#include "core/dtype.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cpu.h"

namespace klein {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::Q8: return "Q8";
    case DType::Q4: return "Q4";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
    case DType::GGML: return "GGML";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  return "?";
}

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::U8:
    case DType::F8_E4M3:
    case DType::F8_E5M2: return 1;
    case DType::Q8:
    case DType::Q4:
    case DType::GGML: return 0;
  }
  return 0;
}

bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

bool dtype_is_fp8(DType t) { return t == DType::F8_E4M3 || t == DType::F8_E5M2; }

// value = (-1)^sign x 2^(e - bias) x 1.m for e > 0, 2^(1 - bias) x 0.m for e = 0; the float32
// is built from its bits (the fp8 mantissa shifted to the top of float32's).
float f8_e4m3_to_f32(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xfu, mant = code & 0x7u;
  uint32_t bits;
  if (exp == 0xf && mant == 0x7) {
    bits = sign | 0x7fc00000u;  // the only NaN; E4M3FN has no infinities
  } else if (exp == 0) {
    // Subnormal: mant x 2^-9, exact in float32 (a small integer times a power of two).
    const float v = float(mant) * 0x1p-9f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp - 7 + 127) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float f8_e5m2_to_f32(uint8_t code) {
  // E5M2 is the upper byte of an IEEE half: the same sign, exponent and leading mantissa bits.
  return f16_to_f32(uint16_t(code) << 8);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                         // below the smallest normal half
    // Subnormal half: value = m * 2^-24. Add 0.5 (as float) to align the bits, round to even.
    float magic;
    const uint32_t magic_bits = 0x3f000000u;  // 0.5
    std::memcpy(&magic, &magic_bits, 4);
    float a;
    std::memcpy(&a, &abs, 4);
    a += magic;
    uint32_t r;
    std::memcpy(&r, &a, 4);
    return sign | uint16_t(r - magic_bits);
  }
  uint32_t m = abs + ((uint32_t(15 - 127) << 23)) + 0xfffu + ((abs >> 13) & 1u);
  return sign | uint16_t(m >> 13);
}

// Portable loops, written so that the compiler vectorises them at the baseline ISA.
static void bf16_to_f32_portable(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = uint32_t(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}
static void f16_to_f32_portable(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}
static void f32_to_f16_portable(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

#if defined(KLEIN_X86)
void f16_to_f32_avx2(const uint16_t* src, float* dst, size_t n);
void f32_to_f16_avx2(const float* src, uint16_t* dst, size_t n);
#endif

void bf16_to_f32(const uint16_t* src, float* dst, size_t n) { bf16_to_f32_portable(src, dst, n); }

void f16_to_f32(const uint16_t* src, float* dst, size_t n) {
#if defined(KLEIN_X86)
  if (cpu_features().avx2) return f16_to_f32_avx2(src, dst, n);
#endif
  f16_to_f32_portable(src, dst, n);
}

void f32_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void f32_to_f16(const float* src, uint16_t* dst, size_t n) {
#if defined(KLEIN_X86)
  if (cpu_features().avx2) return f32_to_f16_avx2(src, dst, n);
#endif
  f32_to_f16_portable(src, dst, n);
}

void to_f32(DType t, const void* src, float* dst, size_t n) {
  if ((t == DType::BF16 || t == DType::F16) && reinterpret_cast<uintptr_t>(src) % 2 != 0) {
    // Bytes at an odd address (a file's data at any offset): converted through an aligned copy.
    uint16_t aligned[1024];
    const auto* bytes = static_cast<const std::byte*>(src);
    for (size_t i = 0; i < n; i += 1024) {
      const size_t k = std::min<size_t>(1024, n - i);
      std::memcpy(aligned, bytes + 2 * i, 2 * k);
      to_f32(t, aligned, dst + i, k);
    }
    return;
  }
  switch (t) {
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::BF16: bf16_to_f32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::F16: f16_to_f32(static_cast<const uint16_t*>(src), dst, n); return;
    case DType::F8_E4M3:
    case DType::F8_E5M2: {
      // A table of the 256 values per call: cheaper than decoding each code once n > 256.
      float table[256];
      for (int c = 0; c < 256; ++c)
        table[c] = t == DType::F8_E4M3 ? f8_e4m3_to_f32(uint8_t(c)) : f8_e5m2_to_f32(uint8_t(c));
      const auto* codes = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = table[codes[i]];
      return;
    }
    default: break;
  }
  // Callers check the type first; reaching here is a programming error, not user input.
  std::memset(dst, 0, n * 4);
}

}  // namespace klein
