#pragma once
// The tensor types of GGML, as GGUF files store them: the type ids, the bytes of each block,
// and the decoding of a row to float32. Bytes only: which tensor a type may hold, or what
// the values mean, is for the callers.
//
// Decoding is bit-exact to the reference decoder of the GGUF format (gguf-py, quants.py):
// every value is the same float32 expression evaluated in the same order, one IEEE
// operation at a time (this file is compiled without floating-point contraction, so
// `a * b - c` is never fused).
//
// Block layouts (all little-endian, d and m are f16, QK_K = 256; "element i" counts within
// the block):
//   Q4_0  18 B / 32   d, qs[16]               v = d * (q - 8)       q of i < 16: qs[i] & 15,
//                                                                   of i + 16: qs[i] >> 4
//   Q4_1  20 B / 32   d, m, qs[16]            v = d * q + m         q as Q4_0
//   Q5_0  22 B / 32   d, qh u32, qs[16]       v = d * (q - 16)      q = Q4 nibble | bit i of qh << 4
//   Q5_1  24 B / 32   d, m, qh u32, qs[16]    v = d * q + m
//   Q8_0  34 B / 32   d, qs int8[32]          v = q * d
//   Q2_K  84 B / 256  scales[16], qs[64], d, dmin
//         16 groups of 16: sc = scales[g] & 15, mn = scales[g] >> 4;
//         q of i = 128 c + 32 s + l: (qs[32 c + l] >> 2 s) & 3
//         v = (d * sc) * q - (dmin * mn)
//   Q3_K  110 B / 256 hmask[32], qs[64], scales[12] (16 six-bit codes), d
//         code g: low 4 bits from scales[g % 8] (g < 8: low nibble, else high nibble), high 2
//         bits (scales[8 + g % 4] >> 2 (g / 4)) & 3; sc = code - 32
//         q of i = 128 c + 32 s + l: (qs[32 c + l] >> 2 s) & 3, minus 4 where bit (i / 32) of
//         hmask[i % 32] is clear;  v = (d * sc) * q
//   Q4_K  144 B / 256 d, dmin, scales[12] (8 six-bit scales and mins), qs[128]
//         j < 4: sc = scales[j] & 63, mn = scales[4 + j] & 63; j >= 4: sc = (scales[8 + j - 4]
//         & 15) | ((scales[j - 4] >> 6) << 4), mn = (scales[8 + j - 4] >> 4) | ((scales[j] >> 6)
//         << 4); q of i = 64 c + 32 h + l: (qs[32 c + l] >> 4 h) & 15 (sub-block j = i / 32)
//         v = (d * sc) * q - (dmin * mn)
//   Q5_K  176 B / 256 d, dmin, scales[12], qh[32], qs[128]
//         as Q4_K, with q |= ((qh[i % 32] >> (i / 32)) & 1) << 4
//   Q6_K  210 B / 256 ql[128], qh[64], scales int8[16], d
//         q of i = 128 c + 64 h + l (l < 64): (ql[64 c + l] >> 4 h) & 15, and of
//         i = 128 c + 32 s + l (l < 32): high bits ((qh[32 c + l] >> 2 s) & 3) << 4;
//         v = (d * scales[i / 16]) * (q - 32)
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace klein::gguf {

// GGML type ids (ggml.h's enum ggml_type); gaps are ids that were retired.
enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

struct TypeInfo {
  TensorType type;
  const char* name;        // as GGML spells it: "Q4_K"
  uint32_t block_elems;    // elements per block (1 for plain types)
  uint32_t block_bytes;    // bytes per block
  bool decodable;          // decode_row handles it
};

// The layout of a type id, or nullopt for an id GGML does not define.
std::optional<TypeInfo> type_info(uint32_t id);
const TypeInfo& type_info(TensorType t);
std::string type_name(TensorType t);

// Decodes `n` elements (a multiple of the type's block size) starting at `src` into `dst`.
// Throws klein::Error for a type that is not decodable (IQ*, TQ*, Q8_1, Q8_K, integers).
void decode_row(TensorType t, const void* src, float* dst, int64_t n);

}  // namespace klein::gguf
