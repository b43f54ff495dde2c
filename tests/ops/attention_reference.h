#pragma once
// The attention the kernels are checked against: a full score row per query, in double
// (tests/ops: ops_test.cpp, amx_emulated_test.cpp). q [q_len, heads·D], k and v
// [kv_len, kv_heads·D]; causal and key_valid as in AttentionParams; a row that sees no key
// gives zeros.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/attention.h"

namespace klein::ops {

inline std::vector<float> naive_attention(const std::vector<float>& q, const std::vector<float>& k,
                                          const std::vector<float>& v, const AttentionParams& p) {
  const int64_t D = p.head_dim, group = p.heads / p.kv_heads;
  std::vector<float> out(size_t(p.q_len * p.heads * D), 0.f);
  for (int64_t h = 0; h < p.heads; ++h)
    for (int64_t i = 0; i < p.q_len; ++i) {
      std::vector<double> s(size_t(p.kv_len), -INFINITY);
      double mx = -INFINITY;
      for (int64_t j = 0; j < p.kv_len; ++j) {
        if (p.causal && j > i + p.causal_offset) continue;
        if (p.key_valid && !p.key_valid[j]) continue;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(q[size_t(i * p.heads * D + h * D + d)]) *
                 k[size_t(j * p.kv_heads * D + (h / group) * D + d)];
        s[size_t(j)] = dot * p.scale;
        mx = std::max(mx, s[size_t(j)]);
      }
      if (mx == -INFINITY) continue;
      double sum = 0;
      for (auto& x : s) sum += (x = std::exp(x - mx));
      for (int64_t d = 0; d < D; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < p.kv_len; ++j)
          acc += s[size_t(j)] * v[size_t(j * p.kv_heads * D + (h / group) * D + d)];
        out[size_t(i * p.heads * D + h * D + d)] = float(acc / sum);
      }
    }
  return out;
}

}  // namespace klein::ops
