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

// Q5: element i's low four bits are a nibble of qs (i < 16: low nibble of qs[i], else the
// high nibble of qs[i - 16]), its fifth bit is bit i of qh.
void q5_0(const uint8_t* b, float* out) {
  const float d = half(b);
  const uint32_t qh = u32(b + 2);
  const uint8_t* qs = b + 6;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * float(int((qs[i] & 15) | ((qh >> i) & 1) << 4) - 16);
    out[i + 16] = d * float(int((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) - 16);
  }
}

void q5_1(const uint8_t* b, float* out) {
  const float d = half(b), m = half(b + 2);
  const uint32_t qh = u32(b + 4);
  const uint8_t* qs = b + 8;
  for (int i = 0; i < 16; ++i) {
    out[i] = d * float((qs[i] & 15) | ((qh >> i) & 1) << 4) + m;
    out[i + 16] = d * float((qs[i] >> 4) | ((qh >> (i + 16)) & 1) << 4) + m;
  }
}

void q8_0(const uint8_t* b, float* out) {
  const float d = half(b);
  for (int i = 0; i < 32; ++i) out[i] = float(int8_t(b[2 + i])) * d;
}

// ---- 256-element super-blocks -----------------------------------------------------------------

// Loops run over runs of 32 elements that share their bit position in the packed bytes; the
// scale products are computed once per group, which gives the same float32 values as per
// element (the same operands, the same rounding).

void q2_k(const uint8_t* b, float* out) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = half(b + 80), dmin = half(b + 82);
  for (int run = 0; run < 8; ++run) {  // i = 32 run + l: bytes qs[32 c + l], bits 2 s
    const int c = run / 4, s = run % 4;
    for (int g = 0; g < 2; ++g) {  // two groups of 16 share a scale
      const uint8_t sc = scales[2 * run + g];
      const float dl = d * float(sc & 15), ml = dmin * float(sc >> 4);
      float* o = out + 32 * run + 16 * g;
      const uint8_t* q = qs + 32 * c + 16 * g;
      for (int l = 0; l < 16; ++l) o[l] = dl * float((q[l] >> (2 * s)) & 3) - ml;
    }
  }
}

void q3_k(const uint8_t* b, float* out) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = half(b + 108);
  for (int run = 0; run < 8; ++run) {
    const int c = run / 4, s = run % 4;
    for (int g = 0; g < 2; ++g) {
      const int k = 2 * run + g;  // the 16-element group
      const int low = k < 8 ? scales[k] & 15 : scales[k - 8] >> 4;
      const int high = (scales[8 + k % 4] >> (2 * (k / 4))) & 3;
      const float dl = d * float((low | high << 4) - 32);
      float* o = out + 32 * run + 16 * g;
      for (int l = 16 * g; l < 16 * g + 16; ++l) {
        int q = (qs[32 * c + l] >> (2 * s)) & 3;
        if (((hmask[l] >> run) & 1) == 0) q -= 4;
        o[l - 16 * g] = dl * float(q);
      }
    }
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
  for (int j = 0; j < 8; ++j) {  // sub-block j: bytes qs[32 (j / 2) + l], nibble j % 2
    const float dl = d * float(sc[j]), ml = dmin * float(mn[j]);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) out[32 * j + l] = dl * float((q[l] >> shift) & 15) - ml;
  }
}

void q5_k(const uint8_t* b, float* out) {
  const float d = half(b), dmin = half(b + 2);
  int sc[8], mn[8];
  k_scales(b + 4, sc, mn);
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int j = 0; j < 8; ++j) {
    const float dl = d * float(sc[j]), ml = dmin * float(mn[j]);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l)
      out[32 * j + l] = dl * float(((q[l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4) - ml;
  }
}

void q6_k(const uint8_t* b, float* out) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int run = 0; run < 8; ++run) {  // i = 128 c + 32 s + l
    const int c = run / 4, s = run % 4;
    const uint8_t* lo = ql + 64 * c + 32 * (s % 2);  // low nibbles: (s / 2) selects the half
    const uint8_t* hi = qh + 32 * c;
    for (int g = 0; g < 2; ++g) {
      const float dl = d * float(scales[2 * run + g]);
      for (int l = 16 * g; l < 16 * g + 16; ++l) {
        const int q = ((lo[l] >> (4 * (s / 2))) & 15) | ((hi[l] >> (2 * s)) & 3) << 4;
        out[32 * run + l] = dl * float(q - 32);
      }
    }
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
  if (n == 0) return;  // an empty row: nothing to read, and either pointer may be null
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
