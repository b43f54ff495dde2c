#pragma once
// Qwen3 as a chat language model (transformers' Qwen3ForCausalLM), for rewriting prompts
// with the text encoder a model already has: every decoder layer, the final norm, and the
// logits from lm_head (from the embedding table when the checkpoint ties them, as Qwen3-4B
// does). The prompt runs once (prefill) and leaves the keys and values of every layer in a
// cache; each later token runs alone at the next position against that cache. Weights are
// acquired one layer at a time on every pass, as the text encoder does.
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "weights/weight_store.h"

namespace klein::qwen3 {

// The unit names a language model needs beyond the text encoder's layers.
inline constexpr const char* kFinalNormUnit = "text_encoder.norm";
inline constexpr const char* kLmHeadUnit = "text_encoder.lm_head";

// Whether `store` holds what LanguageModel runs: every decoder layer of the config and the
// final norm (lm_head may be tied to the embedding). When not, *missing names the first
// unit that is absent.
bool can_generate(const WeightStore& store, std::string* missing = nullptr);

class LanguageModel {
 public:
  // max_tokens: the prompt and everything generated after it (sizes the cache:
  // 2 x layers x max_tokens x kv_heads x head_dim floats).
  LanguageModel(WeightStore& store, Compute& cx, int64_t max_tokens);

  // Runs the prompt from position 0 (the cache is reset) and returns the next-token logits
  // after its last token, [vocab_size] in float32.
  std::vector<float> prefill(std::span<const int32_t> ids);
  // Feeds one token at the next position and returns the logits after it.
  std::vector<float> step(int32_t id);

  // A prompt whose first `keep` tokens are those of an earlier pass still in the cache (a
  // prefix shared by many prompts): runs the rest from position `keep` and returns the logits
  // after the last token.
  std::vector<float> prefill_after(int64_t keep, std::span<const int32_t> rest);
  // The keys and values of the first n positions, [layers, 2, n, kv_heads * head_dim]; and
  // the same put back, the position set to n.
  Tensor cache_rows(int64_t n) const;
  void restore_cache(const Tensor& rows);

  int64_t position() const { return position_; }
  int64_t max_tokens() const { return max_tokens_; }
  const TextEncoderConfig& config() const { return config_; }

 private:
  std::vector<float> forward(std::span<const int32_t> ids);
  void decoder_layer(const WeightUnit& layer, int64_t index, int64_t n);
  void apply_rope(float* rows, int64_t n, int64_t heads);

  WeightStore& store_;
  Compute& cx_;
  TextEncoderConfig config_;
  int64_t max_tokens_;
  int64_t position_ = 0;
  std::vector<float> inv_freq_;
  // Per layer: keys and values of every position so far, [max_tokens, kv_heads * head_dim].
  std::vector<Tensor> keys_, values_;
  // Activations of the tokens of one pass, [n, ...].
  Tensor x_, h_, q_, k_, v_, attn_, gate_, up_;
};

}  // namespace klein::qwen3
