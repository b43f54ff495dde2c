// Qwen3ForCausalLM forward with a key/value cache (transformers' DynamicCache, eager
// attention); MistralForCausalLM's is the same without the q/k norms (qk_norm false: the
// language model of FLUX.2-dev's Mistral-Small-3.1). A pass over n tokens at positions
// p .. p+n-1, x [n, hidden]:
//   per decoder layer (all num_layers of them):
//     h = RMS(x; input_layernorm)
//     q = RMS_head(q_proj h; q_norm), k = RMS_head(k_proj h; k_norm), v = v_proj h
//     q, k <- RoPE(positions p .. p+n-1)           rotate-half, theta from the config
//     cache[p .. p+n) <- k, v
//     x += o_proj attention(q, cache[0 .. p+n))     causal
//     x += down_proj(silu(gate_proj RMS(x)) * up_proj RMS(x))
//   logits = lm_head RMS(x[last]; norm)             lm_head = embed_tokens when tied
// The same layer math as text_encoder.cpp (which stops after the layers the context reads
// and has no cache); the RoPE angles are computed the same way, per position.
#include "models/qwen3/language_model.h"

#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/finite.h"
#include "models/qwen3/layer_weights.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "quant/matmul.h"

namespace klein::qwen3 {

bool can_generate(const WeightStore& store, std::string* missing) {
  const TextEncoderConfig& c = store.config().text_encoder;
  std::vector<std::string> needed = {"text_encoder.embed", kFinalNormUnit};
  for (int64_t l = 0; l < c.num_layers; ++l) needed.push_back(text_layer_unit(l));
  for (const std::string& unit : needed)
    if (!store.has_unit(unit)) {
      if (missing) *missing = unit;
      return false;
    }
  return true;
}

LanguageModel::LanguageModel(WeightStore& store, Compute& cx, int64_t max_tokens)
    : store_(store), cx_(cx), config_(store.config().text_encoder), max_tokens_(max_tokens) {
  std::string missing;
  check(can_generate(store, &missing), "this model cannot run its text encoder as a language "
        "model: it has no ", missing, " (a container converted without --keep-llm keeps only "
        "the layers the image model reads)");
  check(max_tokens > 0, "language model: max_tokens must be positive, got ", max_tokens);
  const auto& c = config_;
  check(c.head_dim % 2 == 0 && c.num_heads % c.num_kv_heads == 0, "text encoder config: ",
        c.num_heads, " heads, ", c.num_kv_heads, " key/value heads of ", c.head_dim);
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  keys_.reserve(size_t(c.num_layers));
  values_.reserve(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    keys_.emplace_back(Shape{max_tokens, kv_dim});
    values_.emplace_back(Shape{max_tokens, kv_dim});
  }
  // As the reference: inv_i = 1 / theta^(2i / head_dim) in float32.
  const int64_t half = c.head_dim / 2;
  inv_freq_.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq_[size_t(i)] = 1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(c.head_dim));
}

// Rotate-half RoPE on n rows [n, heads * head_dim] at positions position_ .. position_+n-1.
void LanguageModel::apply_rope(float* rows, int64_t n, int64_t heads) {
  const int64_t dim = config_.head_dim, half = dim / 2;
  for (int64_t t = 0; t < n; ++t) {
    const float pos = float(position_ + t);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv_freq_[size_t(i)];
      const float c = float(std::cos(double(angle))), s = float(std::sin(double(angle)));
      for (int64_t head = 0; head < heads; ++head) {
        float* x = rows + (t * heads + head) * dim;
        const float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void LanguageModel::decoder_layer(const WeightUnit& layer, int64_t index, int64_t n) {
  const auto& c = config_;
  const int64_t D = c.hidden, F = c.intermediate, HD = c.head_dim;
  const int64_t H = c.num_heads, KV = c.num_kv_heads, kv_dim = KV * HD;
  const float eps = float(c.rms_eps);
  float *x = x_.data(), *h = h_.data(), *q = q_.data(), *k = k_.data(), *v = v_.data();
  float *attn = attn_.data(), *gate = gate_.data(), *up = up_.data();

  const auto input_norm = norm_weight(layer, "input_layernorm.weight", D);
  ops::rms_norm(x, h, n, D, input_norm.data(), eps, cx_);
  ops::linear(h, n, projection(layer, "self_attn.q_proj.weight", H * HD, D), q, cx_);
  ops::linear(h, n, projection(layer, "self_attn.k_proj.weight", kv_dim, D), k, cx_);
  ops::linear(h, n, projection(layer, "self_attn.v_proj.weight", kv_dim, D), v, cx_);
  if (c.qk_norm) {  // Qwen3; Mistral has none
    const auto q_norm = norm_weight(layer, "self_attn.q_norm.weight", HD);
    const auto k_norm = norm_weight(layer, "self_attn.k_norm.weight", HD);
    ops::rms_norm(q, q, n * H, HD, q_norm.data(), eps, cx_);
    ops::rms_norm(k, k, n * KV, HD, k_norm.data(), eps, cx_);
  }
  apply_rope(q, n, H);
  apply_rope(k, n, KV);

  // The new keys and values join the cache; the queries see every cached position up to
  // their own (a prefill from position 0 is causal over itself; one token sees them all).
  Tensor& keys = keys_[size_t(index)];
  Tensor& values = values_[size_t(index)];
  std::memcpy(keys.row(position_), k, size_t(n * kv_dim) * sizeof(float));
  std::memcpy(values.row(position_), v, size_t(n * kv_dim) * sizeof(float));
  ops::AttentionParams p;
  p.q_len = n;
  p.kv_len = position_ + n;
  p.heads = H;
  p.kv_heads = KV;
  p.head_dim = HD;
  p.scale = 1.0f / std::sqrt(float(HD));
  p.causal = n > 1;
  p.causal_offset = position_;  // the queries follow the cached positions
  ops::attention(q, H * HD, keys.data(), kv_dim, values.data(), kv_dim, attn, H * HD, p, cx_);
  ops::linear(attn, n, projection(layer, "self_attn.o_proj.weight", D, H * HD), h, cx_);
  add_inplace(x, h, n * D);

  const auto post_norm = norm_weight(layer, "post_attention_layernorm.weight", D);
  ops::rms_norm(x, h, n, D, post_norm.data(), eps, cx_);
  ops::linear(h, n, projection(layer, "mlp.gate_proj.weight", F, D), gate, cx_);
  ops::linear(h, n, projection(layer, "mlp.up_proj.weight", F, D), up, cx_);
  ops::swiglu(gate, up, gate, n * F, cx_);
  ops::linear(gate, n, projection(layer, "mlp.down_proj.weight", D, F), h, cx_);
  add_inplace(x, h, n * D);
}

std::vector<float> LanguageModel::forward(std::span<const int32_t> ids) {
  const auto& c = config_;
  const int64_t n = int64_t(ids.size());
  check(n > 0, "language model: no tokens to run");
  check(position_ + n <= max_tokens_, "language model: ", position_ + n,
        " tokens do not fit the ", max_tokens_, " the cache was made for");
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  if (x_.numel() < n * c.hidden) {
    x_ = Tensor({n, c.hidden});
    h_ = Tensor({n, c.hidden});
    q_ = Tensor({n, q_dim});
    k_ = Tensor({n, kv_dim});
    v_ = Tensor({n, kv_dim});
    attn_ = Tensor({n, q_dim});
    gate_ = Tensor({n, c.intermediate});
    up_ = Tensor({n, c.intermediate});
  }

  {
    UnitRef unit = store_.acquire("text_encoder.embed");
    const Weight& table = unit->get("embed_tokens.weight");
    check(table.shape.size() == 2 && table.shape[1] == c.hidden, "tensor ", table.name,
          ": expected [vocab, ", c.hidden, "], got ", shape_str(table.shape));
    const quant::Matrix rows = ops::as_matrix(table);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = ids[size_t(t)];
      check(id >= 0 && id < table.rows(), "token id ", id, " is outside the vocabulary (",
            table.rows(), " rows in ", table.name, ")");
      quant::unpack_rows(rows, id, id + 1, x_.data() + t * c.hidden);
    }
  }
  store_.prefetch(text_layer_unit(0));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    cx_.stop_if_cancelled();
    UnitRef unit = store_.acquire(text_layer_unit(l));
    if (l + 1 < c.num_layers) store_.prefetch(text_layer_unit(l + 1));
    decoder_layer(*unit, l, n);
  }
  position_ += n;

  // The final norm and the logits, for the last token only.
  float* last = x_.data() + (n - 1) * c.hidden;
  {
    UnitRef unit = store_.acquire(kFinalNormUnit);
    const auto norm = norm_weight(*unit, "norm.weight", c.hidden);
    ops::rms_norm(last, h_.data(), 1, c.hidden, norm.data(), float(c.rms_eps), cx_);
  }
  const bool tied = !store_.has_unit(kLmHeadUnit);
  UnitRef unit = store_.acquire(tied ? "text_encoder.embed" : kLmHeadUnit);
  const Weight& head = unit->get(tied ? "embed_tokens.weight" : "lm_head.weight");
  check(head.shape.size() == 2 && head.shape[1] == c.hidden, "tensor ", head.name,
        ": expected [vocab, ", c.hidden, "], got ", shape_str(head.shape));
  std::vector<float> logits(size_t(head.rows()));
  ops::linear(h_.data(), 1, head, logits.data(), cx_);
  ops::require_finite(logits.data(), int64_t(logits.size()), "the language model's logits", cx_);
  return logits;
}

std::vector<float> LanguageModel::prefill(std::span<const int32_t> ids) {
  position_ = 0;
  return forward(ids);
}

std::vector<float> LanguageModel::step(int32_t id) {
  check(position_ > 0, "language model: step() before prefill()");
  return forward(std::span<const int32_t>(&id, 1));
}

std::vector<float> LanguageModel::prefill_after(int64_t keep, std::span<const int32_t> rest) {
  check(keep >= 0 && keep <= position_, "language model: ", keep, " positions kept of the ",
        position_, " in the cache");
  position_ = keep;
  return forward(rest);
}

Tensor LanguageModel::cache_rows(int64_t n) const {
  check(n > 0 && n <= position_, "language model: ", n, " cached positions asked of ", position_);
  const int64_t kv_dim = config_.num_kv_heads * config_.head_dim;
  const int64_t layers = int64_t(keys_.size());
  Tensor out({layers, 2, n, kv_dim});
  const size_t bytes = size_t(n * kv_dim) * sizeof(float);
  for (int64_t l = 0; l < layers; ++l) {
    std::memcpy(out.data() + (2 * l) * n * kv_dim, keys_[size_t(l)].data(), bytes);
    std::memcpy(out.data() + (2 * l + 1) * n * kv_dim, values_[size_t(l)].data(), bytes);
  }
  return out;
}

void LanguageModel::restore_cache(const Tensor& rows) {
  const int64_t kv_dim = config_.num_kv_heads * config_.head_dim;
  const int64_t layers = int64_t(keys_.size());
  check(rows.shape().size() == 4 && rows.dim(0) == layers && rows.dim(1) == 2 &&
            rows.dim(3) == kv_dim && rows.dim(2) > 0 && rows.dim(2) <= max_tokens_,
        "language model: cached keys and values of shape ", shape_str(rows.shape()),
        " do not fit [", layers, ", 2, n <= ", max_tokens_, ", ", kv_dim, "]");
  const int64_t n = rows.dim(2);
  const size_t bytes = size_t(n * kv_dim) * sizeof(float);
  for (int64_t l = 0; l < layers; ++l) {
    std::memcpy(keys_[size_t(l)].data(), rows.data() + (2 * l) * n * kv_dim, bytes);
    std::memcpy(values_[size_t(l)].data(), rows.data() + (2 * l + 1) * n * kv_dim, bytes);
  }
  position_ = n;
}

}  // namespace klein::qwen3
