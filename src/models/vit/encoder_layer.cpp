// ViTLayer (transformers' modeling_vit.py), x [T, D], heads H of hd = D / H:
//   h    = LN(x; layernorm_before)                                      eps from the config
//   q, k, v = h · Wᵀ + b                  (attention.attention.{query,key,value})
//   attn = softmax(q kᵀ · hd^-0.5) v      per head, every token sees every token
//   x   += attn · Woᵀ + bo                (attention.output.dense)
//   h    = LN(x; layernorm_after)
//   x   += gelu(h · Wiᵀ + bi) · Wo2ᵀ + bo2   (intermediate.dense, output.dense; exact erf GELU)
#include "models/vit/encoder_layer.h"

#include <cmath>
#include <string>
#include <vector>

#include "models/vit/weights.h"
#include "ops/attention.h"
#include "ops/linear.h"

namespace klein::vit {

namespace {

// y = x · Wᵀ + b for the dense layer `name` ([out, in] and [out]).
void dense(const WeightUnit& unit, const std::string& name, const float* x, int64_t rows,
           int64_t in, int64_t out, float* y, Compute& cx) {
  const Weight& w = shaped(unit, name + ".weight", {out, in});
  const std::vector<float> b = floats(unit, name + ".bias", {out});
  ops::linear(x, rows, w, y, cx);
  ops::add_bias(y, rows, out, out, b.data());
}

// GELU with the exact erf, as torch's nn.functional.gelu: x · 0.5 · (1 + erf(x / √2)).
void gelu_inplace(float* x, int64_t n, Compute& cx) {
  cx.pool().parallel_for(n, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i)
      x[i] = x[i] * 0.5f * (1.0f + std::erf(x[i] * float(M_SQRT1_2)));
  }, 4096);
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace

LayerBuffers::LayerBuffers(const VitConfig& c)
    : h({c.tokens(), c.hidden}),
      q({c.tokens(), c.hidden}),
      k({c.tokens(), c.hidden}),
      v({c.tokens(), c.hidden}),
      attn({c.tokens(), c.hidden}),
      mid({c.tokens(), c.intermediate}) {}

void encoder_layer(const WeightUnit& unit, const VitConfig& c, Tensor& x, LayerBuffers& b,
                   Compute& cx) {
  const int64_t T = c.tokens(), D = c.hidden, F = c.intermediate;
  const int64_t H = c.num_heads, hd = c.head_dim();

  // Self-attention block.
  layer_norm(unit, "layernorm_before", x.data(), b.h.data(), T, D, c.layer_norm_eps, cx);
  dense(unit, "attention.attention.query", b.h.data(), T, D, D, b.q.data(), cx);
  dense(unit, "attention.attention.key", b.h.data(), T, D, D, b.k.data(), cx);
  dense(unit, "attention.attention.value", b.h.data(), T, D, D, b.v.data(), cx);
  ops::AttentionParams p;
  p.q_len = p.kv_len = T;
  p.heads = p.kv_heads = H;
  p.head_dim = hd;
  p.scale = float(1.0 / std::sqrt(double(hd)));  // head_dim ** -0.5
  ops::attention(b.q.data(), D, b.k.data(), D, b.v.data(), D, b.attn.data(), D, p, cx);
  dense(unit, "attention.output.dense", b.attn.data(), T, D, D, b.h.data(), cx);
  add_inplace(x.data(), b.h.data(), T * D);

  // MLP block.
  layer_norm(unit, "layernorm_after", x.data(), b.h.data(), T, D, c.layer_norm_eps, cx);
  dense(unit, "intermediate.dense", b.h.data(), T, D, F, b.mid.data(), cx);
  gelu_inplace(b.mid.data(), T * F, cx);
  dense(unit, "output.dense", b.mid.data(), T, F, D, b.h.data(), cx);
  add_inplace(x.data(), b.h.data(), T * D);
}

}  // namespace klein::vit
