#pragma once
// Internal to attention.cpp: the softmax and tile kernels per instruction set. attention.cpp
// owns the threads, the scratch memory and the choice of path; these only compute.
#include <cstdint>

namespace klein::ops::detail {

// One chunk of keys [k0, k0 + cols) of an online softmax over a block of query rows.
// Row i of `scores` holds the unscaled dot products q_i·k_j; key j of the chunk is visible
// to row i when j < visible0 + i (clamped to [0, cols]) and, with a bias, bias[j] == 0
// (-inf hides it). row_max and row_sum carry the running maximum of the scaled scores (in
// units of the kernel's choosing: natural for the scalar kernel, base 2 for AVX2, AVX-512 and
// NEON; one kernel per call) and the sum of exp(score − row_max) over the chunks seen so
// far; correction[i] receives the factor by which what row i accumulated before this chunk must
// be multiplied (1 when the maximum did not move). A row that has seen no visible key yet
// keeps row_max = -inf, row_sum = 0 and gets probabilities 0.
struct SoftmaxChunk {
  float* scores = nullptr;  // [rows, ld]
  int64_t ld = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  float scale = 1;
  const float* bias = nullptr;  // [cols] or null
  int64_t visible0 = 0;         // cols (or more) when nothing is causal
  float* row_max = nullptr;
  float* row_sum = nullptr;
  float* correction = nullptr;

  // Keys [0, visible(i)) of the chunk can be visible to row i (before the bias).
  int64_t visible(int64_t i) const {
    const int64_t n = visible0 + i;
    return n < 0 ? 0 : n > cols ? cols : n;
  }
};

// The vector kernels work in base 2. 2^f for |f| <= 1/2 is the degree-6 Taylor polynomial
// with these coefficients, highest degree first (relative error < 2e-7).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kExp2Poly[7] = {1.5403530393381609e-4f,
                                1.3333558146428443e-3f,
                                9.6181291076284772e-3f,
                                5.5504108664821580e-2f,
                                2.4022650695910071e-1f,
                                6.9314718055994531e-1f,
                                1.0f};

// exp(scale·s − max) written over the scores in float32 (zero for hidden keys).
void softmax_chunk_f32_scalar(const SoftmaxChunk& c);
#if defined(KLEIN_ARM64)
void softmax_chunk_f32_neon(const SoftmaxChunk& c);
#endif
#if defined(KLEIN_X86)
void softmax_chunk_f32_avx2(const SoftmaxChunk& c);
void scale_rows_avx2(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor);
void softmax_chunk_f32_avx512(const SoftmaxChunk& c);
// The same rounded to bf16 into p [rows, ldp], zero for hidden keys and in [cols,
// padded_cols) (a multiple of 16); row_sum adds up the values before rounding.
void softmax_chunk_bf16_avx512(const SoftmaxChunk& c, uint16_t* p, int64_t ldp,
                               int64_t padded_cols);
// acc[i, 0:n) *= factor[i] for each of `rows` rows with factor != 1.
void scale_rows_avx512(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor);

// --- AMX (attention_amx.cpp), head_dim a multiple of 32 ---
// Keys are packed per key/value head in B-tile layout for Q·Kᵀ: blocks of 16 keys, each
// [head_dim / 32] tiles of 16 pair rows x 32 bf16, pair row p holding dims (32c + 2p,
// 32c + 2p + 1) of the 16 keys: element [b][c][p][2n + j] = K[16b + n][32c + 2p + j].
// Values in B-tile layout for P·V: chunks of 32 keys, each [head_dim / 16] tiles,
// element [kc][n][p][2e + j] = V[32kc + 2p + j][16n + e]. Keys at or past kv_len are zero.
constexpr int64_t kAmxKeyAlign = 32;
constexpr int64_t kAmxTileElements = 512;  // bf16 per tile (16 x 64 bytes)

// The inputs of a group of kv heads and their query heads in tile layouts: keys and values
// as above, [kv_padded / 16 or 32] tile blocks per head, queries as bf16 rows [q_padded, D]
// per head (the A tiles load straight from them). Rows past q_len or kv_len are zero.
struct AmxPack {
  const float* q = nullptr;  // the group's first query head
  const float* k = nullptr;  // the group's first kv head
  const float* v = nullptr;
  int64_t ldq = 0, ldk = 0, ldv = 0;
  int64_t q_len = 0, kv_len = 0, head_dim = 0;
  int64_t q_padded = 0, kv_padded = 0;  // multiples of 32
  int64_t kv_heads = 0;                 // in the group
  int64_t group = 1;                    // query heads per kv head
  uint16_t* keys = nullptr;             // + h * kv_stride for kv head h of the group
  uint16_t* values = nullptr;
  int64_t kv_stride = 0;
  uint16_t* queries = nullptr;          // + h * q_stride for query head h of the group
  int64_t q_stride = 0;
};
// Packs rows [row0, row1) (multiples of 32) of queries, keys and values, reading the inputs
// row by row across the group's heads.
void pack_amx(const AmxPack& g, int64_t row0, int64_t row1);

// One query head, `rows` consecutive queries starting at q0 (rows <= kAmxTaskRows) against
// all keys of the packed kv head, in key chunks of `chunk` (multiple of 32).
constexpr int64_t kAmxSubRows = 32;
constexpr int64_t kAmxTaskRows = 128;
struct AmxTask {
  const uint16_t* queries = nullptr;  // packed row q0 of this head
  float* out = nullptr;               // row q0 of this head's columns
  int64_t ldo = 0;
  int64_t q0 = 0, rows = 0;
  const uint16_t* keys = nullptr;
  const uint16_t* values = nullptr;
  int64_t kv_len = 0, head_dim = 0, chunk = 0;
  float scale = 1;
  bool causal = false;
  int64_t causal_offset = 0;    // with causal: the position of query 0 among the keys
  const float* bias = nullptr;  // [kv_len] or null
  // Scratch: scores [kAmxSubRows, chunk] float, p [kAmxSubRows, chunk] bf16,
  // acc [kAmxTaskRows, head_dim] float, row_max / row_sum / correction [kAmxTaskRows].
  float* scores = nullptr;
  uint16_t* p = nullptr;
  float* acc = nullptr;
  float* row_max = nullptr;
  float* row_sum = nullptr;
  float* correction = nullptr;
};

void attend_amx(const AmxTask& t);
// The same task with VDPBF16PS in vector registers (attention_bf16_avx512.cpp), for AVX-512
// BF16 CPUs without AMX; reads pack_amx's layouts.
void attend_bf16_avx512(const AmxTask& t);
#endif

}  // namespace klein::ops::detail
