// The bf16 attention of AMX CPUs (src/ops/attention_amx.cpp with the softmax of
// src/ops/attention_avx512.cpp) run on any x86 machine: both sources are compiled here against
// plain C++ models of the intrinsics they use, so the path's numerics (Q, K, V and the
// probabilities rounded to bf16 with round-to-nearest-even, float32 tile sums in the order the
// kernels issue them) and its data layout (the key transpose, the value interleave, the tile
// orchestration, the online softmax across key chunks, causal and masked rows) are checked
// against float64 on every CI machine. Where the CPU has AMX the model is also checked against
// the hardware.
//
// The tile model follows the TDPBF16PS definition: for each row m and pair k, C[m][n] +=
// A[m][2k]·B[k][2n] then += A[m][2k+1]·B[k][2n+1], in float32 (each bf16 product is exact in
// float32, so only the additions round).
#include <gtest/gtest.h>

#if defined(KLEIN_X86)

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

// Keep the real intrinsics header out of the kernels' sources (its include guard in GCC and
// in clang).
#define _IMMINTRIN_H_INCLUDED
#define __IMMINTRIN_H

namespace emulated {

struct F16x {  // __m512: 16 float lanes
  float v[16];
};
struct I512 {  // __m512i and __m512bh: 64 bytes
  uint8_t b[64];
  uint16_t word(int i) const {
    uint16_t w;
    std::memcpy(&w, b + 2 * i, 2);
    return w;
  }
  void set_word(int i, uint16_t w) { std::memcpy(b + 2 * i, &w, 2); }
  uint32_t dword(int i) const {
    uint32_t d;
    std::memcpy(&d, b + 4 * i, 4);
    return d;
  }
  void set_dword(int i, uint32_t d) { std::memcpy(b + 4 * i, &d, 4); }
  uint64_t qword(int i) const {
    uint64_t q;
    std::memcpy(&q, b + 8 * i, 8);
    return q;
  }
  void set_qword(int i, uint64_t q) { std::memcpy(b + 8 * i, &q, 8); }
};
struct I256 {  // __m256i and __m256bh: 32 bytes
  uint8_t b[32];
};

// float32 -> bf16, round to nearest even (the conversion instructions' rounding).
inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The AMX tile registers: 8 tiles of up to 16 rows x 64 bytes.
struct Tiles {
  uint8_t data[8][16][64];
  int rows[8];
  int colsb[8];
};
inline Tiles& tiles() {
  static thread_local Tiles t;
  return t;
}

}  // namespace emulated

using __m512 = emulated::F16x;
using __m512i = emulated::I512;
using __m512bh = emulated::I512;
using __m256i = emulated::I256;
using __m256bh = emulated::I256;
using __mmask16 = uint16_t;

#define _MM_FROUND_TO_NEAREST_INT 0x00
#define _MM_FROUND_NO_EXC 0x08
#define _CMP_EQ_OQ 0x00

inline __m512 _mm512_loadu_ps(const void* p) {
  __m512 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline void _mm512_storeu_ps(void* p, __m512 a) { std::memcpy(p, a.v, sizeof a.v); }
inline __m512 _mm512_set1_ps(float x) {
  __m512 r;
  for (float& v : r.v) v = x;
  return r;
}
inline __m512 _mm512_setzero_ps() { return _mm512_set1_ps(0.0f); }
inline __m512i _mm512_setzero_si512() {
  __m512i r;
  std::memset(r.b, 0, sizeof r.b);
  return r;
}
inline void _mm512_storeu_si512(void* p, __m512i a) { std::memcpy(p, a.b, sizeof a.b); }
inline void _mm256_storeu_si256(__m256i* p, __m256i a) { std::memcpy(p, a.b, sizeof a.b); }
#define KLEIN_EMULATED_BINARY(name, expr)       \
  inline __m512 name(__m512 a, __m512 b) {       \
    __m512 r;                                    \
    for (int i = 0; i < 16; ++i) {               \
      const float x = a.v[i], y = b.v[i];        \
      r.v[i] = (expr);                           \
    }                                            \
    return r;                                    \
  }
KLEIN_EMULATED_BINARY(_mm512_add_ps, x + y)
KLEIN_EMULATED_BINARY(_mm512_sub_ps, x - y)
KLEIN_EMULATED_BINARY(_mm512_mul_ps, x * y)
// vscalefps: a · 2^floor(b) (b is a whole number here)
KLEIN_EMULATED_BINARY(_mm512_scalef_ps, std::ldexp(x, int(std::floor(y))))
#undef KLEIN_EMULATED_BINARY
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  for (int i = 0; i < 16; ++i) c.v[i] = std::fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline __m512 _mm512_fmsub_ps(__m512 a, __m512 b, __m512 c) {
  for (int i = 0; i < 16; ++i) c.v[i] = std::fmaf(a.v[i], b.v[i], -c.v[i]);
  return c;
}
inline __m512 _mm512_roundscale_ps(__m512 a, int) {  // to the nearest integer, ties to even
  for (float& v : a.v) v = std::nearbyint(v);
  return a;
}
inline __m512 _mm512_maskz_loadu_ps(__mmask16 m, const void* p) {
  __m512 r = _mm512_setzero_ps();
  const float* f = static_cast<const float*>(p);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) r.v[i] = f[i];
  return r;
}
inline void _mm512_mask_storeu_ps(void* p, __mmask16 m, __m512 a) {
  float* f = static_cast<float*>(p);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) f[i] = a.v[i];
}
inline __m512 _mm512_maskz_mov_ps(__mmask16 m, __m512 a) {
  for (int i = 0; i < 16; ++i)
    if (!(m >> i & 1)) a.v[i] = 0.0f;
  return a;
}
inline __m512 _mm512_mask_max_ps(__m512 src, __mmask16 m, __m512 a, __m512 b) {
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) src.v[i] = a.v[i] > b.v[i] ? a.v[i] : b.v[i];  // vmaxps: b when unordered
  return src;
}
inline __mmask16 _mm512_mask_cmp_ps_mask(__mmask16 m, __m512 a, __m512 b, int) {  // EQ_OQ
  __mmask16 r = 0;
  for (int i = 0; i < 16; ++i)
    if ((m >> i & 1) && a.v[i] == b.v[i]) r = __mmask16(r | 1u << i);
  return r;
}
// Halves, then quarters, ...: the tree the compilers' reduce sequences use.
template <typename Op>
float reduce_tree(__m512 a, Op op) {
  for (int width = 8; width >= 1; width /= 2)
    for (int i = 0; i < width; ++i) a.v[i] = op(a.v[i], a.v[i + width]);
  return a.v[0];
}
inline float _mm512_reduce_add_ps(__m512 a) {
  return reduce_tree(a, [](float x, float y) { return x + y; });
}
inline float _mm512_reduce_max_ps(__m512 a) {
  return reduce_tree(a, [](float x, float y) { return x > y ? x : y; });
}
// bf16 words [0, 16) from b, [16, 32) from a.
inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  __m512bh r;
  for (int i = 0; i < 16; ++i) {
    r.set_word(i, emulated::to_bf16(b.v[i]));
    r.set_word(16 + i, emulated::to_bf16(a.v[i]));
  }
  return r;
}
inline __m256bh _mm512_cvtneps_pbh(__m512 a) {
  __m256bh r;
  for (int i = 0; i < 16; ++i) {
    const uint16_t w = emulated::to_bf16(a.v[i]);
    std::memcpy(r.b + 2 * i, &w, 2);
  }
  return r;
}
// Arguments from word 31 down to word 0.
inline __m512i _mm512_set_epi16(int e31, int e30, int e29, int e28, int e27, int e26, int e25,
                                int e24, int e23, int e22, int e21, int e20, int e19, int e18,
                                int e17, int e16, int e15, int e14, int e13, int e12, int e11,
                                int e10, int e9, int e8, int e7, int e6, int e5, int e4, int e3,
                                int e2, int e1, int e0) {
  const int e[32] = {e0,  e1,  e2,  e3,  e4,  e5,  e6,  e7,  e8,  e9,  e10,
                     e11, e12, e13, e14, e15, e16, e17, e18, e19, e20, e21,
                     e22, e23, e24, e25, e26, e27, e28, e29, e30, e31};
  __m512i r;
  for (int i = 0; i < 32; ++i) r.set_word(i, uint16_t(e[i]));
  return r;
}
inline __m512i _mm512_permutexvar_epi16(__m512i idx, __m512i a) {
  __m512i r;
  for (int i = 0; i < 32; ++i) r.set_word(i, a.word(idx.word(i) & 31));
  return r;
}
// Within each 128-bit lane: the low (or high) halves of a and b interleaved.
inline __m512i _mm512_unpacklo_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < 2; ++i) {
      r.set_dword(4 * l + 2 * i, a.dword(4 * l + i));
      r.set_dword(4 * l + 2 * i + 1, b.dword(4 * l + i));
    }
  return r;
}
inline __m512i _mm512_unpackhi_epi32(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l)
    for (int i = 0; i < 2; ++i) {
      r.set_dword(4 * l + 2 * i, a.dword(4 * l + 2 + i));
      r.set_dword(4 * l + 2 * i + 1, b.dword(4 * l + 2 + i));
    }
  return r;
}
inline __m512i _mm512_unpacklo_epi64(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    r.set_qword(2 * l, a.qword(2 * l));
    r.set_qword(2 * l + 1, b.qword(2 * l));
  }
  return r;
}
inline __m512i _mm512_unpackhi_epi64(__m512i a, __m512i b) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    r.set_qword(2 * l, a.qword(2 * l + 1));
    r.set_qword(2 * l + 1, b.qword(2 * l + 1));
  }
  return r;
}
// 128-bit lanes 0-1 from a, 2-3 from b, each chosen by two bits of imm.
inline __m512i _mm512_shuffle_i32x4(__m512i a, __m512i b, int imm) {
  __m512i r;
  for (int l = 0; l < 4; ++l) {
    const __m512i& src = l < 2 ? a : b;
    std::memcpy(r.b + 16 * l, src.b + 16 * ((imm >> (2 * l)) & 3), 16);
  }
  return r;
}

// Tiles: the configuration's rows and bytes per row; loads and stores with a byte stride.
inline void _tile_loadconfig(const void* config) {
  const auto* c = static_cast<const uint8_t*>(config);
  for (int t = 0; t < 8; ++t) {
    uint16_t colsb;
    std::memcpy(&colsb, c + 16 + 2 * t, 2);
    emulated::tiles().colsb[t] = colsb;
    emulated::tiles().rows[t] = c[48 + t];
  }
}
inline void _tile_release() {}
inline void _tile_zero(int t) { std::memset(emulated::tiles().data[t], 0, sizeof emulated::tiles().data[t]); }
inline void _tile_loadd(int t, const void* base, int64_t stride) {
  emulated::Tiles& s = emulated::tiles();
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(s.data[t][r], static_cast<const uint8_t*>(base) + r * stride, size_t(s.colsb[t]));
}
inline void _tile_stored(int t, void* base, int64_t stride) {
  emulated::Tiles& s = emulated::tiles();
  for (int r = 0; r < s.rows[t]; ++r)
    std::memcpy(static_cast<uint8_t*>(base) + r * stride, s.data[t][r], size_t(s.colsb[t]));
}
inline void _tile_dpbf16ps(int c, int a, int b) {
  emulated::Tiles& s = emulated::tiles();
  for (int m = 0; m < s.rows[c]; ++m)
    for (int k = 0; k < s.colsb[a] / 4; ++k)
      for (int n = 0; n < s.colsb[c] / 4; ++n) {
        float acc;
        std::memcpy(&acc, &s.data[c][m][4 * n], 4);
        uint16_t x[2], y[2];
        std::memcpy(x, &s.data[a][m][4 * k], 4);
        std::memcpy(y, &s.data[b][k][4 * n], 4);
        acc += emulated::from_bf16(x[0]) * emulated::from_bf16(y[0]);
        acc += emulated::from_bf16(x[1]) * emulated::from_bf16(y[1]);
        std::memcpy(&s.data[c][m][4 * n], &acc, 4);
      }
}

// The kernels under their own names, so that they do not replace the library's.
#define pack_amx pack_amx_emulated
#define attend_amx attend_amx_emulated
#define softmax_chunk_bf16_avx512 softmax_chunk_bf16_avx512_emulated
#define softmax_chunk_f32_avx512 softmax_chunk_f32_avx512_emulated
#define scale_rows_avx512 scale_rows_avx512_emulated
#include "../../src/ops/attention_avx512.cpp"
#include "../../src/ops/attention_amx.cpp"
#undef pack_amx
#undef attend_amx
#undef softmax_chunk_bf16_avx512
#undef softmax_chunk_f32_avx512
#undef scale_rows_avx512

#include "core/cpu.h"
#include "ops/attention.h"
#include "ops/compute.h"
#include "support/isa.h"
#include "attention_reference.h"

namespace klein::ops {
namespace {

struct AttentionCase {
  int64_t q_len, kv_len, heads, kv_heads, head_dim, chunk;
  bool causal;
  int64_t hidden_keys;  // the last keys masked out (right padding), and the first two when > 0
  int64_t causal_offset = 0;  // the queries follow this many cached keys
};

struct Inputs {
  std::vector<float> q, k, v;
  std::vector<float> bias;  // empty: no mask
};

Inputs make_inputs(const AttentionCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Inputs in;
  in.q.resize(size_t(c.q_len * c.heads * c.head_dim));
  in.k.resize(size_t(c.kv_len * c.kv_heads * c.head_dim));
  in.v.resize(in.k.size());
  for (auto* x : {&in.q, &in.k, &in.v})
    for (float& f : *x) f = d(rng);
  if (c.hidden_keys > 0) {
    in.bias.assign(size_t(c.kv_len), 0.0f);
    for (int64_t j = c.kv_len - c.hidden_keys; j < c.kv_len; ++j) in.bias[size_t(j)] = -INFINITY;
    in.bias[0] = in.bias[1] = -INFINITY;
  }
  return in;
}

// The emulated kernels driven as attention.cpp drives the hardware ones: all kv heads packed
// at once, then one task per (query head, block of 128 queries).
std::vector<float> emulated_attention(const AttentionCase& c, const Inputs& in, float scale) {
  using namespace detail;
  const int64_t D = c.head_dim, group = c.heads / c.kv_heads;
  const int64_t kv_padded = (c.kv_len + kAmxKeyAlign - 1) / kAmxKeyAlign * kAmxKeyAlign;
  const int64_t q_padded = (c.q_len + kAmxSubRows - 1) / kAmxSubRows * kAmxSubRows;
  const int64_t kv_stride = kv_padded * D, q_stride = q_padded * D;
  std::vector<uint16_t> keys(size_t(c.kv_heads * kv_stride)), values(keys.size()),
      queries(size_t(c.heads * q_stride));
  AmxPack g;
  g.q = in.q.data();
  g.k = in.k.data();
  g.v = in.v.data();
  g.ldq = c.heads * D;
  g.ldk = g.ldv = c.kv_heads * D;
  g.q_len = c.q_len;
  g.kv_len = c.kv_len;
  g.head_dim = D;
  g.q_padded = q_padded;
  g.kv_padded = kv_padded;
  g.kv_heads = c.kv_heads;
  g.group = group;
  g.keys = keys.data();
  g.values = values.data();
  g.kv_stride = kv_stride;
  g.queries = queries.data();
  g.q_stride = q_stride;
  for (int64_t r = 0; r < std::max(kv_padded, q_padded); r += 64) pack_amx_emulated(g, r, r + 64);

  std::vector<float> out(size_t(c.q_len * c.heads * D), 7.0f);
  std::vector<float> scores(size_t(kAmxSubRows * c.chunk)), acc(size_t(kAmxTaskRows * D));
  std::vector<uint16_t> p(size_t(kAmxSubRows * c.chunk));
  std::vector<float> row_max(kAmxTaskRows), row_sum(kAmxTaskRows), correction(kAmxTaskRows);
  for (int64_t h = 0; h < c.heads; ++h)
    for (int64_t q0 = 0; q0 < c.q_len; q0 += kAmxTaskRows) {
      AmxTask t;
      t.queries = queries.data() + h * q_stride + q0 * D;
      t.out = out.data() + q0 * c.heads * D + h * D;
      t.ldo = c.heads * D;
      t.q0 = q0;
      t.rows = std::min(kAmxTaskRows, c.q_len - q0);
      t.keys = keys.data() + (h / group) * kv_stride;
      t.values = values.data() + (h / group) * kv_stride;
      t.kv_len = c.kv_len;
      t.head_dim = D;
      t.chunk = c.chunk;
      t.scale = scale;
      t.causal = c.causal;
      t.causal_offset = c.causal_offset;
      t.bias = in.bias.empty() ? nullptr : in.bias.data();
      t.scores = scores.data();
      t.p = p.data();
      t.acc = acc.data();
      t.row_max = row_max.data();
      t.row_sum = row_sum.data();
      t.correction = correction.data();
      attend_amx_emulated(t);
    }
  return out;
}

// The attention parameters of a case, its mask (when it has one) as key_valid, held in `valid`.
AttentionParams params_of(const AttentionCase& c, const Inputs& in, float scale,
                          std::vector<uint8_t>& valid) {
  AttentionParams p;
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.heads = c.heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.scale = scale;
  p.causal = c.causal;
  p.causal_offset = c.causal_offset;
  valid.clear();
  if (!in.bias.empty()) {
    for (float b : in.bias) valid.push_back(b == 0.0f);
    p.key_valid = valid.data();
  }
  return p;
}

// The reference of tests/ops/attention_reference.h, given the case's mask as key_valid.
std::vector<double> float64_attention(const AttentionCase& c, const Inputs& in, float scale) {
  std::vector<uint8_t> valid;
  const std::vector<float> out = naive_attention(in.q, in.k, in.v, params_of(c, in, scale, valid));
  return {out.begin(), out.end()};
}

// max|got - ref| / max|ref|
double scaled_error(const std::vector<float>& got, const std::vector<double>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    err = std::max(err, std::fabs(got[i] - ref[i]));
    mag = std::max(mag, std::fabs(ref[i]));
  }
  return err / std::max(mag, 1e-30);
}

const AttentionCase kCases[] = {
    {141, 77, 3, 3, 128, 96, false, 0},   // neither length a multiple of 32; one key chunk
    {77, 141, 2, 2, 64, 64, false, 0},    // three key chunks, the last ragged
    {1, 50, 2, 2, 128, 64, false, 0},     // one query row
    {200, 300, 2, 1, 64, 96, false, 0},   // two query tasks of 128 rows, grouped heads
    {130, 130, 8, 2, 128, 64, true, 30},  // the text encoder's case: GQA, causal, padding
    {70, 70, 2, 2, 32, 32, true, 5},      // causal across many small chunks, rows that see nothing
    {30, 130, 4, 2, 64, 32, true, 0, 100},  // causal after 100 cached keys (a language model's
                                            // pass after kept positions), across chunks
};

// Against float64: the bf16 rounding of Q, K, V and P is all that separates them. The real
// kernel is held to 2e-2 (tests/ops/ops_test.cpp, AttentionBf16.*) and measured at 3e-3 to
// 6e-3 on AMX CPUs; the model must land in the same place, well below what a wrong layout
// gives (errors near 1).
TEST(AmxEmulated, Bf16AttentionMatchesFloat64) {
  klein::testing::log_isa_path("ran", "amx-emulated");
  for (const AttentionCase& c : kCases) {
    const Inputs in = make_inputs(c, uint32_t(c.q_len * 31 + c.kv_len));
    const float scale = float(1.0 / std::sqrt(double(c.head_dim)));
    const std::vector<float> got = emulated_attention(c, in, scale);
    const double err = scaled_error(got, float64_attention(c, in, scale));
    std::printf("    emulated AMX attention q %lld kv %lld heads %lld/%lld dim %lld chunk %lld%s%s: "
                "%.2e\n",
                (long long)c.q_len, (long long)c.kv_len, (long long)c.heads,
                (long long)c.kv_heads, (long long)c.head_dim, (long long)c.chunk,
                c.causal ? " causal" : "", c.hidden_keys ? " masked" : "", err);
    EXPECT_LT(err, 1e-2) << "q_len " << c.q_len << " kv_len " << c.kv_len << " dim " << c.head_dim;
  }
}

// Where the CPU has AMX: the model gives the hardware's results up to the order of the
// float32 additions inside a tile product, which the hardware does not specify. Another order
// can put a score on the other side of a bf16 rounding boundary of P, which moves that one
// term by 2^-8 of itself: measured on a Sapphire Rapids CPU, five cases within 8e-7 and one
// (q 77, kv 141) at 4.3e-5; a wrong layout or mask gives errors near 1.
TEST(AmxEmulated, ModelMatchesTheHardware) {
  KLEIN_REQUIRE_ISA(quant::Isa::Amx);
  for (const AttentionCase& c : kCases) {
    const Inputs in = make_inputs(c, 99);
    const float scale = float(1.0 / std::sqrt(double(c.head_dim)));
    std::vector<uint8_t> valid;
    const AttentionParams p = params_of(c, in, scale, valid);
    Compute cx(1);
    cx.arithmetic.bf16_attention = true;
    std::vector<float> hw(size_t(c.q_len * c.heads * c.head_dim));
    attention(in.q.data(), c.heads * c.head_dim, in.k.data(), c.kv_heads * c.head_dim,
              in.v.data(), c.kv_heads * c.head_dim, hw.data(), c.heads * c.head_dim, p, cx);
    // With attention.cpp's key chunks (one chunk of kv_len rounded up to 32 below its
    // largest chunk), the same values are rounded at the same places.
    AttentionCase same = c;
    same.chunk = (c.kv_len + detail::kAmxKeyAlign - 1) / detail::kAmxKeyAlign * detail::kAmxKeyAlign;
    const std::vector<float> model = emulated_attention(same, in, scale);
    std::vector<double> hw64(hw.begin(), hw.end());
    const double err = scaled_error(model, hw64);
    std::printf("    model against the hardware, q %lld kv %lld: %.2e\n", (long long)c.q_len,
                (long long)c.kv_len, err);
    EXPECT_LT(err, 2e-4) << "q_len " << c.q_len;
  }
}

}  // namespace
}  // namespace klein::ops

#endif  // KLEIN_X86
