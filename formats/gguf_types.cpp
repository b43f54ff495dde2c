#include "formats/gguf_types.h"

#include <array>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"

namespace klein::gguf {

namespace {

constexpr uint32_t kQK = 256;  // elements of a K-quant super-block

constexpr std::array kTypes = {
    TypeInfo{TensorType::F32, "F32", 1, 4, true},
    TypeInfo{TensorType::F16, "F16", 1, 2, true},
    TypeInfo{TensorType::Q4_0, "Q4_0", 32, 18, true},
    TypeInfo{TensorType::Q4_1, "Q4_1", 32, 20, true},
    TypeInfo{TensorType::Q5_0, "Q5_0", 32, 22, true},
    TypeInfo{TensorType::Q5_1, "Q5_1", 32, 24, true},
    TypeInfo{TensorType::Q8_0, "Q8_0", 32, 34, true},
    TypeInfo{TensorType::Q8_1, "Q8_1", 32, 40, false},
    TypeInfo{TensorType::Q2_K, "Q2_K", kQK, 84, true},
    TypeInfo{TensorType::Q3_K, "Q3_K", kQK, 110, true},
    TypeInfo{TensorType::Q4_K, "Q4_K", kQK, 144, true},
    TypeInfo{TensorType::Q5_K, "Q5_K", kQK, 176, true},
    TypeInfo{TensorType::Q6_K, "Q6_K", kQK, 210, true},
    TypeInfo{TensorType::Q8_K, "Q8_K", kQK, 292, false},
    TypeInfo{TensorType::IQ2_XXS, "IQ2_XXS", kQK, 66, false},
    TypeInfo{TensorType::IQ2_XS, "IQ2_XS", kQK, 74, false},
    TypeInfo{TensorType::IQ3_XXS, "IQ3_XXS", kQK, 98, false},
    TypeInfo{TensorType::IQ1_S, "IQ1_S", kQK, 50, false},
    TypeInfo{TensorType::IQ4_NL, "IQ4_NL", 32, 18, false},
    TypeInfo{TensorType::IQ3_S, "IQ3_S", kQK, 110, false},
    TypeInfo{TensorType::IQ2_S, "IQ2_S", kQK, 82, false},
    TypeInfo{TensorType::IQ4_XS, "IQ4_XS", kQK, 136, false},
    TypeInfo{TensorType::I8, "I8", 1, 1, false},
    TypeInfo{TensorType::I16, "I16", 1, 2, false},
    TypeInfo{TensorType::I32, "I32", 1, 4, false},
    TypeInfo{TensorType::I64, "I64", 1, 8, false},
    TypeInfo{TensorType::F64, "F64", 1, 8, false},
    TypeInfo{TensorType::IQ1_M, "IQ1_M", kQK, 56, false},
    TypeInfo{TensorType::BF16, "BF16", 1, 2, true},
    TypeInfo{TensorType::TQ1_0, "TQ1_0", kQK, 54, false},
    TypeInfo{TensorType::TQ2_0, "TQ2_0", kQK, 66, false},
};

uint16_t u16(const uint8_t* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) { return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24; }
float half(const uint8_t* p) { return f16_to_f32(u16(p)); }

// ---- 32-element blocks ----------------------------------------------------------------------

void q4_0(const uint8_t* b, float* out) {
  const float d = half(b);
  const uint8_t* qs = b + 2;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * float(int(qs[i] & 15) - 8);
    out[i + 16] = d * float(int(qs[i] >> 4) - 8);
  }
}

void q4_1(const uint8_t* b, float* out) {
  const float d = half(b), m = half(b + 2);
  const uint8_t* qs = b + 4;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * float(qs[i] & 15) + m;
    out[i + 16] = d * float(qs[i] >> 4) + m;
  }
}

// The 5-bit value of element i: a nibble of qs and bit i of qh.
int q5(const uint8_t* qs, uint32_t qh, int i) {
  const int low = i < 16 ? qs[i] & 15 : qs[i - 16] >> 4;
  return low | int((qh >> i) & 1) << 4;
}

void q5_0(const uint8_t* b, float* out) {
  const float d = half(b);
  const uint32_t qh = u32(b + 2);
  for (int i = 0; i < 32; ++i) out[i] = d * float(q5(b + 6, qh, i) - 16);
}

void q5_1(const uint8_t* b, float* out) {
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = u32(b + 4);
  for (int i = 0; i < 32; ++i) out[i] = d * float(q5(b + 8, qh, i)) + m;
}

void q8_0(const uint8_t* b, float* out) {
  const float d = half(b);
  for (int i = 0; i < 32; ++i) out[i] = float(int8_t(b[2 + i])) * d;
}

// ---- 256-element super-blocks -----------------------------------------------------------------

void q2_k(const uint8_t* b, float* out) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  for (uint32_t i = 0; i < kQK; ++i) {
    const uint32_t c = i / 128, s = (i / 32) % 4, l = i % 32;
    const int q = (qs[32 * c + l] >> (2 * s)) & 3;
    const uint8_t sc = scales[i / 16];
    const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
    out[i] = dl * float(q) - ml;
  }
}

void q3_k(const uint8_t* b, float* out) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = half(b + 108);
  float dl[16];
  for (int g = 0; g < 16; ++g) {
    const int low = g < 8 ? scales[g] & 15 : scales[g - 8] >> 4;
    const int high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    dl[g] = d * float((low | high << 4) - 32);
  }
  for (uint32_t i = 0; i < kQK; ++i) {
    const uint32_t c = i / 128, s = (i / 32) % 4, l = i % 32;
    int q = (qs[32 * c + l] >> (2 * s)) & 3;
    if (((hmask[i % 32] >> (i / 32)) & 1) == 0) q -= 4;
    out[i] = dl[i / 16] * float(q);
  }
}

// The eight 6-bit scales and mins of a Q4_K / Q5_K super-block.
void k_scales(const uint8_t* s, int sc[8], int mn[8]) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[4 + j] & 63;
    sc[j + 4] = (s[8 + j] & 15) | (s[j] >> 6) << 4;
    mn[j + 4] = (s[8 + j] >> 4) | (s[4 + j] >> 6) << 4;
  }
}

void q4_k(const uint8_t* b, float* out) {
  const float d = half(b), dmin = half(b + 2);
  int sc[8], mn[8];
  k_scales(b + 4, sc, mn);
  const uint8_t* qs = b + 16;
  for (uint32_t i = 0; i < kQK; ++i) {
    const uint32_t c = i / 64, h = (i / 32) % 2, l = i % 32, j = i / 32;
    const int q = (qs[32 * c + l] >> (4 * h)) & 15;
    out[i] = (d * float(sc[j])) * float(q) - dmin * float(mn[j]);
  }
}

void q5_k(const uint8_t* b, float* out) {
  const float d = half(b), dmin = half(b + 2);
  int sc[8], mn[8];
  k_scales(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (uint32_t i = 0; i < kQK; ++i) {
    const uint32_t c = i / 64, h = (i / 32) % 2, l = i % 32, j = i / 32;
    const int q = ((qs[32 * c + l] >> (4 * h)) & 15) | ((qh[l] >> j) & 1) << 4;
    out[i] = (d * float(sc[j])) * float(q) - dmin * float(mn[j]);
  }
}

void q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (uint32_t i = 0; i < kQK; ++i) {
    const uint32_t c = i / 128, r = i % 128;
    const int low = (ql[64 * c + r % 64] >> (4 * (r / 64))) & 15;
    const int high = (qh[32 * c + r % 32] >> (2 * (r / 32))) & 3;
    out[i] = (d * float(scales[i / 16])) * float((low | high << 4) - 32);
  }
}

}  // namespace

std::optional<TypeInfo> type_info(uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (uint32_t(t.type) == id) return t;
  return std::nullopt;
}

const TypeInfo& type_info(TensorType t) {
  for (const TypeInfo& info : kTypes)
    if (info.type == t) return info;
  fail("GGML tensor type ", uint32_t(t), " is not known");
}

std::string type_name(TensorType t) {
  const auto info = type_info(uint32_t(t));
  return info ? info->name : "type " + std::to_string(uint32_t(t));
}

void decode_row(TensorType t, const void* src, float* dst, int64_t n) {
  const TypeInfo& info = type_info(t);
  check(info.decodable, "GGML tensor type ", info.name, " cannot be read (readable: F32, F16, BF16, ",
        "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)");
  check(n % info.block_elems == 0, "a row of ", n, " elements is not whole ", info.name, " blocks of ",
        info.block_elems);
  const auto* p = static_cast<const uint8_t*>(src);
  switch (t) {
    case TensorType::F32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case TensorType::F16:
      f16_to_f32(static_cast<const uint16_t*>(src), dst, size_t(n));
      return;
    case TensorType::BF16:
      bf16_to_f32(static_cast<const uint16_t*>(src), dst, size_t(n));
      return;
    default:
      break;
  }
  void (*block)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case TensorType::Q4_0: block = q4_0; break;
    case TensorType::Q4_1: block = q4_1; break;
    case TensorType::Q5_0: block = q5_0; break;
    case TensorType::Q5_1: block = q5_1; break;
    case TensorType::Q8_0: block = q8_0; break;
    case TensorType::Q2_K: block = q2_k; break;
    case TensorType::Q3_K: block = q3_k; break;
    case TensorType::Q4_K: block = q4_k; break;
    case TensorType::Q5_K: block = q5_k; break;
    case TensorType::Q6_K: block = q6_k; break;
    default: fail("GGML tensor type ", info.name, " has no decoder");
  }
  for (int64_t i = 0; i < n / info.block_elems; ++i)
    block(p + i * info.block_bytes, dst + i * info.block_elems);
}

}  // namespace klein::gguf
