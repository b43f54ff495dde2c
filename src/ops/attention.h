#pragma once
// Scaled dot-product attention computed in tiles with an online softmax: memory is
// O(tile), never a [heads, q_len, kv_len] score matrix.
//
// Two paths:
//  - exact (default): float32 throughout. A block of 256 query rows of one head meets the
//    keys in chunks of up to 1024 (all of them up to that length) through sgemm, with the
//    softmax vectorised (AVX-512 when the CPU has it, else libm).
//  - bf16 (Compute::arithmetic.bf16_attention, on CPUs with AMX-BF16, or AVX-512 BF16 where
//    VDPBF16PS is fast): Q, K
//    and V rounded to bf16, Q·Kᵀ and P·V with float32 sums (AMX tiles, else VDPBF16PS), the
//    softmax in float32 and P rounded to bf16, as the reference implementation does on GPUs.
//    The inputs of a group of heads (up to 16 MB of bf16) are packed into tile layouts once
//    per call; blocks of 128 query rows meet the keys in chunks of up to 1024. Error against
//    float64 attention: 2e-3 to 4e-3 of max|out| for unit-scale Gaussian q, k, v (tests/ops
//    bounds it by 2e-2). Without either, when head_dim is not a multiple of 32 or when kv_len
//    is 0 the exact path runs.
#include <cstdint>

#include "ops/compute.h"

namespace klein::ops {

struct AttentionParams {
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t heads = 1;      // query heads
  int64_t kv_heads = 1;   // key/value heads; query head h uses kv head h / (heads / kv_heads)
  int64_t head_dim = 0;
  float scale = 0;        // usually 1/sqrt(head_dim)
  bool causal = false;    // key j visible to query i only if j <= i + causal_offset
  // With causal: the position of query 0 among the keys (queries that follow causal_offset
  // keys already in the cache, as a language model's pass after kept positions).
  int64_t causal_offset = 0;
  // Optional [kv_len] flags: keys with key_valid[j] == 0 are hidden from every query.
  const uint8_t* key_valid = nullptr;
};

// q: [q_len, heads * head_dim] with row stride ldq (head h at columns [h*head_dim, ...)),
// k, v: [kv_len, kv_heads * head_dim] with strides ldk, ldv; out: [q_len, heads * head_dim]
// with stride ldo. A query that sees no key at all gets zeros.
void attention(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
               int64_t ldv, float* out, int64_t ldo, const AttentionParams& p, Compute& cx);

// Whether attention(p) in this context takes the bf16 path (for tests and reports). Without
// AMX only on CPUs whose VDPBF16PS outruns their FMAs (CpuFeatures::avx512_bf16_fast).
bool uses_bf16_attention(const AttentionParams& p, const Compute& cx);

// The bf16 path with VDPBF16PS whatever the CPU's speed at it (tests and benchmarks); needs
// an AVX-512 context on a CPU with AVX-512 BF16, head_dim a multiple of 32 and kv_len > 0.
void attention_bf16_vector(const float* q, int64_t ldq, const float* k, int64_t ldk,
                           const float* v, int64_t ldv, float* out, int64_t ldo,
                           const AttentionParams& p, Compute& cx);

}  // namespace klein::ops
