// Attention's bf16 form on AVX-512 BF16 without AMX (Zen 4, or KLEIN_ISA=avx512 on an AMX CPU):
// the AMX path's arithmetic with VDPBF16PS in vector registers instead of tile products. The
// inputs are packed by pack_amx (attention_amx.cpp: plain AVX-512 BF16 instructions), whose
// layouts suit VDPBF16PS as they are:
//   keys     row p of tile [b][c] is 16 dwords, lane n = dims (32c + 2p, 32c + 2p + 1) of key
//            16b + n: one VDPBF16PS with the query's dword 16c + p broadcast adds that dim
//            pair to the scores of 16 keys;
//   values   row p of tile [kc][n] is 16 dwords, lane e = (V[32kc + 2p][16n + e],
//            V[32kc + 2p + 1][16n + e]): with P's dword for keys (32kc + 2p, + 1) broadcast it
//            adds two keys' share to 16 output dims.
// Q·Kᵀ and P·V sum in float32, the softmax is the AMX path's (softmax_chunk_bf16_avx512: P
// rounded to bf16), so the two paths differ only in the order of the float32 additions.
// Compiled with the AVX-512 flags (-mavx512bf16 among them).
#include <immintrin.h>
// GCC 12's intrinsics start some conversions from _mm512_undefined_*(), which it then reports.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "ops/attention_bf16_task.h"
#include "ops/attention_kernels.h"

namespace klein::ops::detail {

namespace {

constexpr int64_t kScoreRows = 8;  // query rows x 2 key blocks of 16: 16 accumulators
constexpr int64_t kValueRows = 4;  // query rows x 4 dim blocks of 16: 16 accumulators
constexpr int64_t kValueBlocks = 4;

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, __m512bh(a), __m512bh(b));
}

__m512i broadcast_dword(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// scores[0:32, 0:cols) = 32 query rows of qb · keys [k0, k0 + cols)ᵀ, cols a multiple of 32.
void score_block(const uint16_t* qb, const uint16_t* keys, int64_t k0, int64_t cols, int64_t D,
                 float* scores, int64_t ld) {
  const int64_t chunks = D / 32;
  for (int64_t j = 0; j < cols; j += 32) {
    const uint16_t* b0 = keys + ((k0 + j) / 16) * chunks * kAmxTileElements;
    const uint16_t* b1 = b0 + chunks * kAmxTileElements;
    for (int64_t r0 = 0; r0 < kAmxSubRows; r0 += kScoreRows) {
      __m512 acc[kScoreRows][2];
      for (int r = 0; r < kScoreRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t p = 0; p < 16; ++p) {
          const __m512i k_lo = _mm512_loadu_si512(b0 + c * kAmxTileElements + 32 * p);
          const __m512i k_hi = _mm512_loadu_si512(b1 + c * kAmxTileElements + 32 * p);
#pragma GCC unroll 8
          for (int r = 0; r < kScoreRows; ++r) {
            const __m512i q = broadcast_dword(qb + (r0 + r) * D + 32 * c + 2 * p);
            acc[r][0] = dot(acc[r][0], q, k_lo);
            acc[r][1] = dot(acc[r][1], q, k_hi);
          }
        }
      }
      for (int r = 0; r < kScoreRows; ++r) {
        _mm512_storeu_ps(scores + (r0 + r) * ld + j, acc[r][0]);
        _mm512_storeu_ps(scores + (r0 + r) * ld + j + 16, acc[r][1]);
      }
    }
  }
}

// acc[0:32, 0:D) += P [32, cols) · values [k0, k0 + cols), cols a multiple of 32.
void value_block(const uint16_t* p, int64_t ldp, const uint16_t* values, int64_t k0, int64_t cols,
                 int64_t D, float* acc) {
  const int64_t blocks = D / 16;
  const uint16_t* v0 = values + (k0 / 32) * blocks * kAmxTileElements;
  for (int64_t r0 = 0; r0 < kAmxSubRows; r0 += kValueRows) {
    for (int64_t n0 = 0; n0 < blocks; n0 += kValueBlocks) {
      const int64_t nb = min64(kValueBlocks, blocks - n0);  // D / 16 is even: 2 or 4
      __m512 sum[kValueRows][kValueBlocks];
      for (int r = 0; r < kValueRows; ++r)
        for (int n = 0; n < kValueBlocks; ++n)
          sum[r][n] = n < nb ? _mm512_loadu_ps(acc + (r0 + r) * D + 16 * (n0 + n))
                             : _mm512_setzero_ps();
      for (int64_t kc = 0; kc < cols / 32; ++kc) {
        const uint16_t* tiles = v0 + kc * blocks * kAmxTileElements;
        for (int64_t pp = 0; pp < 16; ++pp) {
          __m512i v[kValueBlocks];
#pragma GCC unroll 4
          for (int n = 0; n < kValueBlocks; ++n)
            v[n] = n < nb ? _mm512_loadu_si512(tiles + (n0 + n) * kAmxTileElements + 32 * pp)
                          : _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int r = 0; r < kValueRows; ++r) {
            const __m512i pr = broadcast_dword(p + (r0 + r) * ldp + 32 * kc + 2 * pp);
#pragma GCC unroll 4
            for (int n = 0; n < kValueBlocks; ++n) sum[r][n] = dot(sum[r][n], pr, v[n]);
          }
        }
      }
      for (int r = 0; r < kValueRows; ++r)
        for (int n = 0; n < nb; ++n) _mm512_storeu_ps(acc + (r0 + r) * D + 16 * (n0 + n), sum[r][n]);
    }
  }
}

}  // namespace

void attend_bf16_avx512(const AmxTask& t) {
  attend_bf16_task(t, score_block, value_block);
}

}  // namespace klein::ops::detail
