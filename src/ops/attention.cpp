#include "ops/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "ops/blas.h"

namespace klein::ops {

namespace {

// Tile sizes: a [kQueryTile, kKeyTile] block of scores and a [kQueryTile, head_dim]
// accumulator stay in L2 while the keys and values stream past.
constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 256;

struct TileScratch {
  std::vector<float> scores;   // [kQueryTile, kKeyTile]
  std::vector<float> acc;      // [kQueryTile, head_dim]
  std::vector<float> row_max;  // running max per query
  std::vector<float> row_sum;  // running softmax denominator per query
};

bool key_visible(const AttentionParams& p, int64_t query, int64_t key) {
  if (p.causal && key > query) return false;
  if (p.key_valid && !p.key_valid[key]) return false;
  return true;
}

// One (head, query tile): stream over key tiles with an online softmax.
void attend_tile(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                 int64_t ldv, float* out, int64_t ldo, const AttentionParams& p, int64_t head,
                 int64_t q0, TileScratch& s) {
  const int64_t D = p.head_dim;
  const int64_t rows = std::min(kQueryTile, p.q_len - q0);
  const int64_t kv_head = head / (p.heads / p.kv_heads);
  const float* qh = q + q0 * ldq + head * D;
  const float* kh = k + kv_head * D;
  const float* vh = v + kv_head * D;
  const bool masked = p.causal || p.key_valid;
  const float neg_inf = -std::numeric_limits<float>::infinity();

  std::fill(s.acc.begin(), s.acc.begin() + rows * D, 0.0f);
  std::fill(s.row_max.begin(), s.row_max.begin() + rows, neg_inf);
  std::fill(s.row_sum.begin(), s.row_sum.begin() + rows, 0.0f);

  // With a causal mask no key after the last query of the tile is visible.
  const int64_t kv_end = p.causal ? std::min(p.kv_len, q0 + rows) : p.kv_len;
  for (int64_t k0 = 0; k0 < kv_end; k0 += kKeyTile) {
    const int64_t cols = std::min(kKeyTile, kv_end - k0);
    float* S = s.scores.data();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(cols), int(D), p.scale,
                qh, int(ldq), kh + k0 * ldk, int(ldk), 0.0f, S, int(kKeyTile));
    for (int64_t i = 0; i < rows; ++i) {
      float* srow = S + i * kKeyTile;
      if (masked)
        for (int64_t j = 0; j < cols; ++j)
          if (!key_visible(p, q0 + i, k0 + j)) srow[j] = neg_inf;
      float tile_max = neg_inf;
      for (int64_t j = 0; j < cols; ++j) tile_max = std::max(tile_max, srow[j]);
      const float new_max = std::max(s.row_max[i], tile_max);
      if (new_max == neg_inf) {  // nothing visible yet in this row
        std::fill(srow, srow + cols, 0.0f);
        continue;
      }
      // Rescale what was accumulated under the old maximum.
      const float correction = std::exp(s.row_max[i] - new_max);
      float sum = 0;
      for (int64_t j = 0; j < cols; ++j) {
        srow[j] = std::exp(srow[j] - new_max);
        sum += srow[j];
      }
      s.row_sum[i] = s.row_sum[i] * correction + sum;
      s.row_max[i] = new_max;
      if (correction != 1.0f) {
        float* a = s.acc.data() + i * D;
        for (int64_t d = 0; d < D; ++d) a[d] *= correction;
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(D), int(cols), 1.0f, S,
                int(kKeyTile), vh + k0 * ldv, int(ldv), 1.0f, s.acc.data(), int(D));
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* o = out + (q0 + i) * ldo + head * D;
    const float* a = s.acc.data() + i * D;
    const float inv = s.row_sum[i] > 0 ? 1.0f / s.row_sum[i] : 0.0f;
    for (int64_t d = 0; d < D; ++d) o[d] = a[d] * inv;
  }
}

}  // namespace

void attention(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
               int64_t ldv, float* out, int64_t ldo, const AttentionParams& p, ThreadPool& pool) {
  check(p.heads > 0 && p.kv_heads > 0 && p.heads % p.kv_heads == 0, "attention: ", p.heads,
        " query heads cannot share ", p.kv_heads, " key/value heads");
  check(p.head_dim > 0, "attention: head_dim must be positive");
  if (p.q_len == 0) return;
  ensure_blas_single_threaded();
  const int64_t q_tiles = (p.q_len + kQueryTile - 1) / kQueryTile;
  const int64_t tasks = p.heads * q_tiles;
  pool.for_each_task(tasks, [&](int64_t t, int) {
    thread_local TileScratch s;
    s.scores.resize(size_t(kQueryTile * kKeyTile));
    s.acc.resize(size_t(kQueryTile * p.head_dim));
    s.row_max.resize(size_t(kQueryTile));
    s.row_sum.resize(size_t(kQueryTile));
    attend_tile(q, ldq, k, ldk, v, ldv, out, ldo, p, t / q_tiles, (t % q_tiles) * kQueryTile, s);
  });
}

}  // namespace klein::ops
