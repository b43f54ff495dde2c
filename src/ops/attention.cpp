#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/cpu.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/attention_kernels.h"
#include "ops/gemm.h"

namespace klein::ops {

namespace detail {

void softmax_chunk_f32_scalar(const SoftmaxChunk& c) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < c.rows; ++i) {
    float* s = c.scores + i * c.ld;
    const int64_t n = c.visible(i);
    float chunk_max = neg_inf;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = s[j] * c.scale + (c.bias ? c.bias[j] : 0.0f);
      chunk_max = std::max(chunk_max, s[j]);
    }
    const float new_max = std::max(c.row_max[i], chunk_max);
    if (new_max == neg_inf) {  // nothing visible yet in this row
      c.correction[i] = 1.0f;
      std::fill(s, s + c.cols, 0.0f);
      continue;
    }
    // What was accumulated under the old maximum is rescaled by the caller.
    c.correction[i] = std::exp(c.row_max[i] - new_max);
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - new_max);
      sum += s[j];
    }
    std::fill(s + n, s + c.cols, 0.0f);
    c.row_sum[i] = c.row_sum[i] * c.correction[i] + sum;
    c.row_max[i] = new_max;
  }
}

}  // namespace detail

namespace {

using detail::SoftmaxChunk;

// A block of kQueryTile query rows of one head is one task of the exact path; keys come in
// chunks of at most kMaxKeyChunk, so the [rows, chunk] scores and the [rows, head_dim]
// accumulator stay in L2 while the keys and values stream past. Both products are our gemm
// (ops/gemm.h), which packs the keys and values of a chunk again for every task: 256 rows
// make that a small part of the work.
constexpr int64_t kQueryTile = 256;
constexpr int64_t kMaxKeyChunk = 1024;
// The bf16 path packs the keys and values of this many bytes of kv heads at a time.
constexpr int64_t kPackBudget = int64_t(16) << 20;

// Keys per chunk: all of them up to kMaxKeyChunk, else equal chunks of at most that.
int64_t key_chunk(int64_t keys, int64_t align) {
  const int64_t n = std::max<int64_t>(1, (keys + kMaxKeyChunk - 1) / kMaxKeyChunk);
  return round_up(std::max<int64_t>(1, (keys + n - 1) / n), align);
}

// key_valid as an additive bias: 0 for a visible key, -inf for a hidden one; null without.
const float* key_bias(const AttentionParams& p, Arena::Scope& arena) {
  if (!p.key_valid) return nullptr;
  float* bias = arena.take<float>(size_t(p.kv_len));
  for (int64_t j = 0; j < p.kv_len; ++j)
    bias[j] = p.key_valid[j] ? 0.0f : -std::numeric_limits<float>::infinity();
  return bias;
}

void scale_rows_scalar(float* acc, int64_t ld, int64_t rows, int64_t n, const float* factor) {
  for (int64_t i = 0; i < rows; ++i)
    if (factor[i] != 1.0f)
      for (int64_t d = 0; d < n; ++d) acc[i * ld + d] *= factor[i];
}

struct ExactKernels {
  void (*softmax)(const SoftmaxChunk&) = detail::softmax_chunk_f32_scalar;
  void (*scale_rows)(float*, int64_t, int64_t, int64_t, const float*) = scale_rows_scalar;
  quant::Isa isa = quant::Isa::Scalar;  // of the products
};

ExactKernels exact_kernels(const Compute& cx) {
  ExactKernels k;
  k.isa = cx.isa();
#if defined(KLEIN_X86)
  if (cx.avx512()) {
    k.softmax = detail::softmax_chunk_f32_avx512;
    k.scale_rows = detail::scale_rows_avx512;
  } else if (cx.isa() == quant::Isa::Avx2) {
    k.softmax = detail::softmax_chunk_f32_avx2;
    k.scale_rows = detail::scale_rows_avx2;
  }
#elif defined(KLEIN_ARM64)
  if (cx.isa() == quant::Isa::Neon) k.softmax = detail::softmax_chunk_f32_neon;
#endif
  return k;
}

// The buffers of one (head, query tile) task, from the worker's arena.
struct TileScratch {
  TileScratch(Arena::Scope& arena, int64_t chunk, int64_t head_dim)
      : scores(arena.take<float>(size_t(kQueryTile * chunk))),
        acc(arena.take<float>(size_t(kQueryTile * head_dim))),
        row_max(arena.take<float>(size_t(kQueryTile))),
        row_sum(arena.take<float>(size_t(kQueryTile))),
        correction(arena.take<float>(size_t(kQueryTile))),
        pack(arena.take<float>(gemm_pack_floats())) {}
  float* scores;      // [kQueryTile, chunk]
  float* acc;         // [kQueryTile, head_dim]
  float* row_max;     // running max per query
  float* row_sum;     // running softmax denominator per query
  float* correction;  // per query, for the current chunk
  float* pack;        // gemm's packing buffer
};

// One (head, query tile) of the exact path: the key chunks with an online softmax.
void attend_tile(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                 int64_t ldv, float* out, int64_t ldo, const AttentionParams& p,
                 const float* bias, int64_t chunk, const ExactKernels& kern, int64_t head,
                 int64_t q0, TileScratch& s) {
  const int64_t D = p.head_dim;
  const int64_t rows = std::min(kQueryTile, p.q_len - q0);
  const int64_t kv_head = head / (p.heads / p.kv_heads);
  const float* qh = q + q0 * ldq + head * D;
  const float* kh = k + kv_head * D;
  const float* vh = v + kv_head * D;

  std::fill(s.row_max, s.row_max + rows, -std::numeric_limits<float>::infinity());
  std::fill(s.row_sum, s.row_sum + rows, 0.0f);

  // With a causal mask no key after the last query of the tile is visible.
  const int64_t first = q0 + p.causal_offset;  // the position of the tile's first query
  const int64_t kv_end = p.causal ? std::min(p.kv_len, first + rows) : p.kv_len;
  for (int64_t k0 = 0; k0 < kv_end; k0 += chunk) {
    const int64_t cols = std::min(chunk, kv_end - k0);
    float* S = s.scores;
    // S = Q · Kᵀ                                                           [rows, cols]
    gemm({.M = rows, .N = cols, .K = D, .a = qh, .lda = ldq, .b = kh + k0 * ldk, .ldb = ldk,
          .b_transposed = true, .c = S, .ldc = chunk},
         kern.isa, s.pack);
    SoftmaxChunk c;
    c.scores = S;
    c.ld = chunk;
    c.rows = rows;
    c.cols = cols;
    c.scale = p.scale;
    c.bias = bias ? bias + k0 : nullptr;
    c.visible0 = p.causal ? first - k0 + 1 : cols;
    c.row_max = s.row_max;
    c.row_sum = s.row_sum;
    c.correction = s.correction;
    kern.softmax(c);
    if (k0 > 0) kern.scale_rows(s.acc, D, rows, D, s.correction);
    // acc (+)= P · V                                                       [rows, D]
    gemm({.M = rows, .N = D, .K = cols, .a = S, .lda = chunk, .b = vh + k0 * ldv, .ldb = ldv,
          .c = s.acc, .ldc = D, .accumulate = k0 > 0},
         kern.isa, s.pack);
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* o = out + (q0 + i) * ldo + head * D;
    if (kv_end == 0 || s.row_sum[i] <= 0) {
      std::fill(o, o + D, 0.0f);
      continue;
    }
    const float* a = s.acc + i * D;
    const float inv = 1.0f / s.row_sum[i];
    for (int64_t d = 0; d < D; ++d) o[d] = a[d] * inv;
  }
}

void attention_exact(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                     int64_t ldv, float* out, int64_t ldo, const AttentionParams& p,
                     const float* bias, Compute& cx) {
  const ExactKernels kern = exact_kernels(cx);
  const int64_t chunk = key_chunk(p.kv_len, 16);
  const int64_t q_tiles = (p.q_len + kQueryTile - 1) / kQueryTile;
  cx.pool().for_each_task(p.heads * q_tiles, [&](int64_t t, int worker) {
    Arena::Scope arena(cx.arena(worker));
    TileScratch s(arena, chunk, p.head_dim);
    attend_tile(q, ldq, k, ldk, v, ldv, out, ldo, p, bias, chunk, kern, t / q_tiles,
                (t % q_tiles) * kQueryTile, s);
  });
}

#if defined(KLEIN_X86)

// The bf16 path: inputs packed once per group of heads, then one task per (head, block of
// query rows) on AMX tiles or, without AMX, with VDPBF16PS (`attend`).
void attention_bf16(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                    int64_t ldv, float* out, int64_t ldo, const AttentionParams& p,
                    const float* bias, Compute& cx, void (*attend)(const detail::AmxTask&)) {
  using namespace detail;
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  const int64_t kv_padded = round_up(p.kv_len, kAmxKeyAlign);
  const int64_t q_padded = round_up(p.q_len, kAmxSubRows);
  const int64_t chunk = key_chunk(p.kv_len, kAmxKeyAlign);
  // Per kv head: its keys and values, then the queries of its query heads, all bf16.
  const int64_t kv_stride = kv_padded * D, q_stride = q_padded * D;
  const int64_t per_head = 2 * kv_stride + group * q_stride;
  const int64_t fit = std::max<int64_t>(1, kPackBudget / (per_head * int64_t(sizeof(uint16_t))));
  const int64_t groups = (p.kv_heads + fit - 1) / fit;
  const int64_t group_heads = (p.kv_heads + groups - 1) / groups;
  // The packed inputs, from the calling thread's arena (worker 0 nests its tasks' scopes
  // inside this one).
  Arena::Scope arena(cx.arena(0));
  uint16_t* const keys = arena.take<uint16_t>(size_t(group_heads * per_head));
  uint16_t* const values = keys + group_heads * kv_stride;
  uint16_t* const queries = values + group_heads * kv_stride;

  constexpr int64_t kPackRows = 64;  // rows per packing task
  const int64_t pieces = (std::max(kv_padded, q_padded) + kPackRows - 1) / kPackRows;
  const int64_t q_tasks = (p.q_len + kAmxTaskRows - 1) / kAmxTaskRows;
  for (int64_t g0 = 0; g0 < p.kv_heads; g0 += group_heads) {
    AmxPack g;
    g.q = q + g0 * group * D;
    g.k = k + g0 * D;
    g.v = v + g0 * D;
    g.ldq = ldq;
    g.ldk = ldk;
    g.ldv = ldv;
    g.q_len = p.q_len;
    g.kv_len = p.kv_len;
    g.head_dim = D;
    g.q_padded = q_padded;
    g.kv_padded = kv_padded;
    g.kv_heads = std::min(group_heads, p.kv_heads - g0);
    g.group = group;
    g.keys = keys;
    g.values = values;
    g.kv_stride = kv_stride;
    g.queries = queries;
    g.q_stride = q_stride;
    cx.pool().for_each_task(pieces, [&](int64_t t, int) {
      pack_amx(g, t * kPackRows, (t + 1) * kPackRows);
    });
    cx.pool().for_each_task(g.kv_heads * group * q_tasks, [&](int64_t t, int worker) {
      Arena::Scope scratch(cx.arena(worker));
      const int64_t local_head = t / q_tasks, q0 = (t % q_tasks) * kAmxTaskRows;
      const int64_t kv_head = local_head / group;
      AmxTask task;
      task.queries = queries + local_head * q_stride + q0 * D;
      task.out = out + q0 * ldo + (g0 * group + local_head) * D;
      task.ldo = ldo;
      task.q0 = q0;
      task.rows = std::min(kAmxTaskRows, p.q_len - q0);
      task.keys = keys + kv_head * kv_stride;
      task.values = values + kv_head * kv_stride;
      task.kv_len = p.kv_len;
      task.head_dim = D;
      task.chunk = chunk;
      task.scale = p.scale;
      task.causal = p.causal;
      task.causal_offset = p.causal_offset;
      task.bias = bias;
      task.scores = scratch.take<float>(size_t(kAmxSubRows * chunk));
      task.p = scratch.take<uint16_t>(size_t(kAmxSubRows * chunk));
      task.acc = scratch.take<float>(size_t(kAmxTaskRows * D));
      task.row_max = scratch.take<float>(size_t(kAmxTaskRows));
      task.row_sum = scratch.take<float>(size_t(kAmxTaskRows));
      task.correction = scratch.take<float>(size_t(kAmxTaskRows));
      attend(task);
    });
  }
}
#endif

}  // namespace

bool uses_bf16_attention(const AttentionParams& p, const Compute& cx) {
#if defined(KLEIN_X86)
  // Without AMX only where VDPBF16PS outruns FMA (AMD): on Intel cores the exact path is the
  // faster one (36 against 45 ms at 768 tokens, SPEED.md).
  return cx.arithmetic.bf16_attention && p.head_dim % 32 == 0 && p.kv_len > 0 &&
         (cx.amx() || (cx.avx512() && cpu_features().avx512_bf16_fast));
#else
  return false;
#endif
}

void attention_bf16_vector(const float* q, int64_t ldq, const float* k, int64_t ldk,
                           const float* v, int64_t ldv, float* out, int64_t ldo,
                           const AttentionParams& p, Compute& cx) {
#if defined(KLEIN_X86)
  check(cx.avx512() && cpu_features().avx512_bf16 && p.head_dim % 32 == 0 && p.kv_len > 0,
        "attention_bf16_vector: needs AVX-512 BF16, head_dim a multiple of 32 and keys");
  check(p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0, "attention: ", p.heads,
        " query heads cannot share ", p.kv_heads, " key/value heads");
  if (p.q_len == 0) return;
  Arena::Scope arena(cx.arena(0));
  attention_bf16(q, ldq, k, ldk, v, ldv, out, ldo, p, key_bias(p, arena), cx,
                 detail::attend_bf16_avx512);
#else
  fail("attention_bf16_vector: needs AVX-512 BF16");
#endif
}

void attention(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
               int64_t ldv, float* out, int64_t ldo, const AttentionParams& p, Compute& cx) {
  check(p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0, "attention: ", p.heads,
        " query heads cannot share ", p.kv_heads, " key/value heads");
  check(p.head_dim > 0, "attention: head_dim must be positive");
  check(p.causal_offset >= 0, "attention: causal_offset must not be negative, got ",
        p.causal_offset);
  if (p.q_len == 0) return;
  Arena::Scope arena(cx.arena(0));
  const float* b = key_bias(p, arena);
#if defined(KLEIN_X86)
  if (uses_bf16_attention(p, cx)) {
    attention_bf16(q, ldq, k, ldk, v, ldv, out, ldo, p, b, cx,
                   cx.amx() ? detail::attend_amx : detail::attend_bf16_avx512);
    return;
  }
#endif
  attention_exact(q, ldq, k, ldk, v, ldv, out, ldo, p, b, cx);
}

}  // namespace klein::ops
