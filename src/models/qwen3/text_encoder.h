#pragma once
// The Qwen3 text encoder of FLUX.2-klein: padded token ids -> the context the transformer
// attends to, [seq, 3 * hidden] = the residual stream after decoder layers 9, 18 and 27,
// concatenated per token. Only the layers that feed the context are ever loaded.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "weights/weight_store.h"

namespace klein::qwen3 {

// Sees the residual stream [seq, hidden] after the embedding (layer 0) and after each decoder
// layer k (1-based, as the pipeline's hidden_states[k]); for layer-by-layer checks and dumps.
using LayerObserver = std::function<void(int64_t layer, const Tensor& hidden)>;

// Keeps its activation buffers between calls (about 70 MB for Qwen3-4B at 512 tokens), so
// encoding a prompt and the empty negative prompt allocates once; destroy it before the
// denoising loop to return that memory.
class TextEncoder {
 public:
  // The store must outlive the encoder; weights are acquired one layer at a time per call.
  TextEncoder(WeightStore& store, Compute& cx);

  // ids and mask: [seq] (mask 1 = token, 0 = padding; klein's pipeline pads on the right
  // to 512; padding on the left is computed as the reference computes it too). Returns the context [seq, config().context_dim()], padding rows included.
  Tensor encode(std::span<const int32_t> ids, std::span<const int32_t> mask,
                const LayerObserver& observe = {});

  const TextEncoderConfig& config() const { return config_; }
  // Changes whenever the weights could have changed (WeightStore::identity()); keys caches.
  std::string weights_identity() const { return store_.identity(); }

 private:
  // Activations for one sequence length, allocated once and reused by every layer.
  struct Activations {
    int64_t seq = 0;
    Tensor x;                       // [seq, hidden]  residual stream
    Tensor h;                       // [seq, hidden]  normed input / projection output
    Tensor q;                       // [seq, heads * head_dim]
    Tensor k, v;                    // [seq, kv_heads * head_dim]
    Tensor attn;                    // [seq, heads * head_dim]
    Tensor gate, up;                // [seq, intermediate]
    std::vector<float> cos, sin;    // [seq, head_dim / 2]  RoPE tables
    std::vector<uint8_t> key_valid; // [seq]  the attention mask as the attention op takes it
  };

  void prepare(int64_t seq);
  void embed_tokens(std::span<const int32_t> ids);
  void decoder_layer(const WeightUnit& layer);
  void apply_rope(float* rows, int64_t heads);
  void attend_unseeing_rows(const float* v, float* attn);

  WeightStore& store_;
  Compute& cx_;
  TextEncoderConfig config_;
  Activations a_;
};

}  // namespace klein::qwen3
