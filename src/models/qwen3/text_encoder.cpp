// Qwen3 text encoder forward (transformers Qwen3Model, eager attention), as the FLUX.2-klein
// pipeline uses it: no logits, no final norm, nothing after the last layer it reads. The
// language model of FLUX.2-dev's Mistral3 encoder is the same decoder without the q/k norms
// (TextEncoderConfig::qk_norm false; Mistral-Small-3.1: hidden 5120, 40 layers of which
// 1..30 are computed, 32 query / 8 key-value heads x 128, RMS eps 1e-5, RoPE theta 1e9,
// context = layers 10, 20, 30).
//
// Qwen3-4B (klein-4B):       hidden 2560, MLP 9728 (SwiGLU), 36 decoder layers of which 1..27
//                            are computed, 32 query heads / 8 key-value heads x head_dim 128,
//                            RMSNorm eps 1e-6 (plain weight), rotate-half RoPE theta 1e6,
//                            vocab 151936, no biases anywhere.
// Per layer, x [seq, hidden]:
//   h = RMS(x; input_layernorm)
//   q = RMS_head(q_proj h; q_norm), k = RMS_head(k_proj h; k_norm), v = v_proj h
//   q, k <- RoPE(position 0..seq-1)
//   x += o_proj attention(q, k, v)        causal; padding keys hidden from every query
//   h = RMS(x; post_attention_layernorm)
//   x += down_proj (silu(gate_proj h) * up_proj h)
// Context: [x after layer 9 | after 18 | after 27] per token -> [512, 7680].
//
// Numerics follow the float32 reference: RoPE inverse frequencies, angles and cos/sin in
// float32; softmax and norms as in ops/.
#include "models/qwen3/text_encoder.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/finite.h"
#include "ops/attention.h"
#include "models/qwen3/layer_weights.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "quant/matmul.h"

namespace klein::qwen3 {

namespace {

void check_config(const TextEncoderConfig& c) {
  check(c.hidden > 0 && c.intermediate > 0 && c.head_dim > 0 && c.head_dim % 2 == 0,
        "text encoder config: hidden ", c.hidden, ", intermediate ", c.intermediate,
        ", head_dim ", c.head_dim, " (must be positive, head_dim even for RoPE)");
  check(c.num_heads > 0 && c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0,
        "text encoder config: ", c.num_heads, " attention heads cannot share ", c.num_kv_heads,
        " key/value heads");
  int64_t previous = 0;
  for (int64_t layer : c.output_layers) {
    check(layer > previous && layer <= c.num_layers, "text encoder config: output layers must be ",
          "increasing and within 1..", c.num_layers, ", got ", layer);
    previous = layer;
  }
}

}  // namespace

TextEncoder::TextEncoder(WeightStore& store, Compute& cx)
    : store_(store), cx_(cx), config_(store.config().text_encoder) {
  check_config(config_);
}

void TextEncoder::prepare(int64_t seq) {
  if (a_.seq == seq) return;
  const auto& c = config_;
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  a_.seq = seq;
  a_.x = Tensor({seq, c.hidden});
  a_.h = Tensor({seq, c.hidden});
  a_.q = Tensor({seq, q_dim});
  a_.k = Tensor({seq, kv_dim});
  a_.v = Tensor({seq, kv_dim});
  a_.attn = Tensor({seq, q_dim});
  a_.gate = Tensor({seq, c.intermediate});
  a_.up = Tensor({seq, c.intermediate});
  a_.key_valid.assign(size_t(seq), 0);

  // RoPE tables, as the reference builds them in float32: inv_i = 1 / theta^(2i / head_dim),
  // angle = position * inv_i rounded to float, then cos/sin of that float angle.
  const int64_t half = c.head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[size_t(i)] =
        1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(c.head_dim));
  a_.cos.resize(size_t(seq * half));
  a_.sin.resize(size_t(seq * half));
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = float(p) * inv_freq[size_t(i)];
      a_.cos[size_t(p * half + i)] = float(std::cos(double(angle)));
      a_.sin[size_t(p * half + i)] = float(std::sin(double(angle)));
    }
}

// x = rows of embed_tokens for the ids. Only seq rows of the table are ever converted, from
// whatever storage type it has (a converted model may keep it as Q8).
void TextEncoder::embed_tokens(std::span<const int32_t> ids) {
  UnitRef unit = store_.acquire("text_encoder.embed");
  const Weight& table = unit->get("embed_tokens.weight");
  check(table.shape.size() == 2 && table.shape[1] == config_.hidden, "tensor ", table.name,
        ": expected [vocab, ", config_.hidden, "], got ", shape_str(table.shape));
  const quant::Matrix rows = ops::as_matrix(table);
  for (size_t t = 0; t < ids.size(); ++t) {
    check(ids[t] >= 0 && ids[t] < table.rows(), "token id ", ids[t], " at position ", t,
          " is outside the text encoder vocabulary (", table.rows(), " rows in ", table.name, ")");
    quant::unpack_rows(rows, ids[t], ids[t] + 1, a_.x.row(int64_t(t)));
  }
}

// Rotate-half RoPE on [seq, heads * head_dim] in place: dimension i pairs with i + head_dim/2
// (not interleaved pairs as in the FLUX transformer).
void TextEncoder::apply_rope(float* rows, int64_t heads) {
  const int64_t dim = config_.head_dim, half = dim / 2;
  cx_.pool().parallel_for(a_.seq, [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      const float* cos = a_.cos.data() + p * half;
      const float* sin = a_.sin.data() + p * half;
      for (int64_t head = 0; head < heads; ++head) {
        float* x = rows + (p * heads + head) * dim;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = x[i], x2 = x[i + half];
          x[i] = x1 * cos[i] - x2 * sin[i];
          x[i + half] = x2 * cos[i] + x1 * sin[i];
        }
      }
    }
  }, 16);
}

// The reference (transformers' eager attention) masks with the float minimum rather than
// -inf: a row whose every key is masked (the rows before the first real token, when the
// padding is on the left) has all its scores at that minimum, so its softmax is uniform over
// all seq positions, masked and future ones included. Those rows get the mean of every value
// row of their key/value head (ops::attention gives them zeros).
void TextEncoder::attend_unseeing_rows(const float* v, float* attn) {
  const auto& c = config_;
  const int64_t S = a_.seq, HD = c.head_dim, H = c.num_heads, KV = c.num_kv_heads;
  int64_t unseeing = 0;  // rows 0..unseeing-1 see no key: no valid key at or before them
  while (unseeing < S && a_.key_valid[size_t(unseeing)] == 0) ++unseeing;
  if (unseeing == 0) return;
  std::vector<double> mean(size_t(KV * HD), 0.0);
  for (int64_t j = 0; j < S; ++j)
    for (int64_t d = 0; d < KV * HD; ++d) mean[size_t(d)] += v[j * KV * HD + d];
  std::vector<float> row(size_t(H * HD));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t d = 0; d < HD; ++d)
      row[size_t(h * HD + d)] = float(mean[size_t((h / (H / KV)) * HD + d)] / double(S));
  for (int64_t i = 0; i < unseeing; ++i)
    std::memcpy(attn + i * H * HD, row.data(), row.size() * sizeof(float));
}

void TextEncoder::decoder_layer(const WeightUnit& layer) {
  const auto& c = config_;
  const int64_t S = a_.seq, D = c.hidden, F = c.intermediate, HD = c.head_dim;
  const int64_t H = c.num_heads, KV = c.num_kv_heads;
  const float eps = float(c.rms_eps);
  float *x = a_.x.data(), *h = a_.h.data();
  float *q = a_.q.data(), *k = a_.k.data(), *v = a_.v.data(), *attn = a_.attn.data();
  float *gate = a_.gate.data(), *up = a_.up.data();

  // Self-attention block.
  const auto input_norm = norm_weight(layer, "input_layernorm.weight", D);
  ops::rms_norm(x, h, S, D, input_norm.data(), eps, cx_);
  ops::linear(h, S, projection(layer, "self_attn.q_proj.weight", H * HD, D), q, cx_);
  ops::linear(h, S, projection(layer, "self_attn.k_proj.weight", KV * HD, D), k, cx_);
  ops::linear(h, S, projection(layer, "self_attn.v_proj.weight", KV * HD, D), v, cx_);

  // Qwen3's per-head RMSNorm of q and k, before RoPE (Mistral has none).
  if (c.qk_norm) {
    const auto q_norm = norm_weight(layer, "self_attn.q_norm.weight", HD);
    const auto k_norm = norm_weight(layer, "self_attn.k_norm.weight", HD);
    ops::rms_norm(q, q, S * H, HD, q_norm.data(), eps, cx_);
    ops::rms_norm(k, k, S * KV, HD, k_norm.data(), eps, cx_);
  }
  apply_rope(q, H);
  apply_rope(k, KV);

  // Causal attention in which padding keys are hidden from every query. Under right padding
  // every row sees the real tokens before it; under left padding the leading padding rows
  // see no key at all, and attend_unseeing_rows gives them what the reference gives them.
  ops::AttentionParams p;
  p.q_len = p.kv_len = S;
  p.heads = H;
  p.kv_heads = KV;
  p.head_dim = HD;
  p.scale = 1.0f / std::sqrt(float(HD));
  p.causal = true;
  p.key_valid = a_.key_valid.data();
  ops::attention(q, H * HD, k, KV * HD, v, KV * HD, attn, H * HD, p, cx_);
  attend_unseeing_rows(v, attn);

  ops::linear(attn, S, projection(layer, "self_attn.o_proj.weight", D, H * HD), h, cx_);
  add_inplace(x, h, S * D);

  // SwiGLU MLP block.
  const auto post_norm = norm_weight(layer, "post_attention_layernorm.weight", D);
  ops::rms_norm(x, h, S, D, post_norm.data(), eps, cx_);
  ops::linear(h, S, projection(layer, "mlp.gate_proj.weight", F, D), gate, cx_);
  ops::linear(h, S, projection(layer, "mlp.up_proj.weight", F, D), up, cx_);
  cx_.pool().parallel_for(S * F, [&](int64_t i0, int64_t i1, int) {
    ops::swiglu(gate + i0, up + i0, gate + i0, i1 - i0, cx_);
  }, 4096);
  ops::linear(gate, S, projection(layer, "mlp.down_proj.weight", D, F), h, cx_);
  add_inplace(x, h, S * D);
}

Tensor TextEncoder::encode(std::span<const int32_t> ids, std::span<const int32_t> mask,
                           const LayerObserver& observe) {
  check(!ids.empty(), "text encoder: empty token sequence");
  check(ids.size() == mask.size(), "text encoder: ", ids.size(), " token ids but ", mask.size(),
        " attention mask entries");
  const int64_t seq = int64_t(ids.size());
  const int64_t layers = config_.layers_needed();
  prepare(seq);
  for (int64_t t = 0; t < seq; ++t) {
    check(mask[size_t(t)] == 0 || mask[size_t(t)] == 1, "text encoder: attention mask entry ", t,
          " is ", mask[size_t(t)], "; expected 0 or 1");
    a_.key_valid[size_t(t)] = uint8_t(mask[size_t(t)]);
  }

  store_.prefetch(text_layer_unit(0));
  embed_tokens(ids);
  if (observe) observe(0, a_.x);

  Tensor context({seq, config_.context_dim()});
  for (int64_t layer = 0; layer < layers; ++layer) {
    cx_.stop_if_cancelled();
    {
      UnitRef unit = store_.acquire(text_layer_unit(layer));
      if (layer + 1 < layers) store_.prefetch(text_layer_unit(layer + 1));
      decoder_layer(*unit);
    }  // the layer's weights are released before the next one is acquired
    const int64_t done = layer + 1;  // hidden_states[done] in the reference's numbering
    if (observe) observe(done, a_.x);
    cx_.report_step(done, layers);
    for (size_t j = 0; j < config_.output_layers.size(); ++j) {
      if (config_.output_layers[j] != done) continue;
      for (int64_t t = 0; t < seq; ++t)
        std::memcpy(context.row(t) + int64_t(j) * config_.hidden, a_.x.row(t),
                    size_t(config_.hidden) * sizeof(float));
    }
  }
  ops::require_finite(context.data(), context.numel(), "the text encoder's output", cx_);
  return context;
}

}  // namespace klein::qwen3
