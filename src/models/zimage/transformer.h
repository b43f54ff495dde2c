#pragma once
// The Z-Image transformer (diffusers ZImageTransformer2DModel, basic mode): one forward over
// the image tokens of one latent and the caption tokens of one prompt, returning the model's
// output for every latent value. The math is in transformer.cpp.
//
// One sequence of S rows is planned per generation and every stream lives in it:
//   rows [0, Nx)       image tokens (patch tokens of the latent, padded to a multiple of 32)
//   rows [Nx, Nx + Lc) caption tokens (text-encoder rows, padded to a multiple of 32)
// The noise refiner runs on the image rows, the context refiner on the caption rows, then the
// main layers on all of them: the official "unified" sequence [image | caption] is these rows
// as they stand, so nothing is copied between the phases.
//
// What depends on what:
//   per prompt       embed_caption (caption rows through the embedder and context refiner)
//   per step         embed_timestep (t only): the modulation input of every block
//   per forward      the image rows through the noise refiner, the main layers, the final layer
// CFG runs the prompt and the negative prompt as two sequences (the official batch of two
// masks the batch padding, which makes each item equal to its run alone).
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "models/zimage/checkpoint/config.h"
#include "ops/compute.h"
#include "ops/rope.h"
#include "ops/work.h"
#include "weights/lora.h"
#include "weights/weight_store.h"

namespace klein::zimage {

// Rows are padded to multiples of this (the official SEQ_MULTI_OF).
constexpr int64_t kSequenceMultiple = 32;

inline int64_t padded(int64_t n) {
  return (n + kSequenceMultiple - 1) / kSequenceMultiple * kSequenceMultiple;
}

// Sizes of one sequence: the latent grid [C, height, width] and the caption length.
struct SequenceLayout {
  int64_t height = 0, width = 0;  // latent pixels (multiples of the patch size)
  int64_t caption = 0;            // real caption tokens (before padding)
  int64_t patch = 2;

  int64_t image_tokens() const { return (height / patch) * (width / patch); }
  int64_t image_rows() const { return padded(image_tokens()); }
  int64_t caption_rows() const { return padded(caption); }
  int64_t rows() const { return image_rows() + caption_rows(); }
};

// Position ids (t, h, w) of the rows, [rows, 3] row-major, as the official patchify gives
// them: image token (y, x) is (Lc + 1, y, x) with Lc the padded caption length and image pad
// rows (0, 0, 0); caption row i is (1 + i, 0, 0), pad rows included.
std::vector<int64_t> position_ids(const SequenceLayout& layout);

// Intermediate values for tests: ("t_embedder", "x_embedder", "x_seq_in", "noise_refiner_{i}",
// "cap_embedder", "cap_seq_in", "context_refiner_{i}", "layers_{i}", "final_layer"). The data
// is only valid during the call.
using Observer = std::function<void(std::string_view name, const float* data, const Shape& shape)>;

// The buffers of one sequence, planned once per generation and reused by every block.
//   seq            [S, D]   the residual stream (image rows, then caption rows)
//   normed         [S, D]   a block's normalised (and modulated) input
//   q, k, v, attn  [S, D]   attention, heads side by side
//   gate, up       [chunk, F] the feed-forward's two projections, `chunk_rows` rows at a time
//   ffn            [chunk, D] the feed-forward's output before its norm
//   caption        [Lc, D]  the caption rows after the context refiner (embed_caption)
struct Activations {
  static constexpr int64_t kChunkRows = 512;
  Activations(const TransformerConfig& config, const SequenceLayout& layout);
  // What the constructor allocates for this layout (the RoPE tables included), for memory
  // plans before a run; and what an instance holds.
  static size_t plan_bytes(const TransformerConfig& config, const SequenceLayout& layout);
  size_t bytes() const;

  SequenceLayout layout;
  ops::RopeTable rope;
  Tensor seq, normed, q, k, v, attn, gate, up, ffn, caption;
};

// The multiply-adds of one forward over `layout` (klein bench step): in every block Q, K, V,
// the output (4 D²) and the feed-forward's w1, w3, w2 (3 F D) on the rows it runs (the noise
// refiners on the image rows, the context refiners on the caption rows, the main layers on
// both, padding included), attention over the same rows, the timestep embedding and the
// modulation vectors (one row each), x_embedder and the final layer on the image rows. embed_caption is once per prompt.
ops::ForwardWork forward_work(const TransformerConfig& config, const SequenceLayout& layout);

class Transformer {
 public:
  // `adapters`: LoRA updates applied beside every linear weight they name (may be null).
  Transformer(WeightStore& store, const TransformerConfig& config,
              const Adapters* adapters = nullptr);

  const TransformerConfig& config() const { return config_; }
  WeightStore& store() const { return store_; }

  // The modulation input [adaln_dim] for model time t (0 = noise, 1 = clean; the pipeline's
  // (1000 - timestep) / 1000): t_embedder(t · t_scale).
  Tensor embed_timestep(float t, Compute& cx);
  // The caption rows of `act` (kept in act.caption, copied into the sequence by every forward):
  // cap_feats [L, cap_feat_dim] (L = the layout's caption) padded by
  // repeating the last row, RMSNorm + Linear, pad rows set to cap_pad_token, then the context
  // refiner. They depend on the prompt only.
  void embed_caption(const Tensor& cap_feats, Activations& act, Compute& cx,
                     const Observer& observe = {});
  // Called after each main layer with the stream [S, D] (a ControlNet adds its hints there).
  using LayerHook = std::function<void(int64_t layer, float* stream)>;
  // The model output for latents [C, height, width] at the modulation `adaln` (embed_timestep),
  // after embed_caption on the same `act`: [C, height, width].
  Tensor forward(const Tensor& latents, const Tensor& adaln, Activations& act, Compute& cx,
                 const Observer& observe = {}, const LayerHook& after_layer = {});

  // The forward in its parts, for step caching (step_cache.h): start, main_layer 0 to
  // n_layers - 1, finish.
  // The image rows through the embedder and the noise refiner, the caption rows beside them:
  // act.seq is the unified sequence the main layers take.
  void start(const Tensor& latents, const Tensor& adaln, Activations& act, Compute& cx,
             const Observer& observe = {});
  // Main layer i on act.seq. With `padding_row` ([D]), also that layer's output for a zero row
  // that attends to the sequence's rows and is attended by none: what the official batched
  // forward computes on the padding rows of a sequence shorter than the batch's longest.
  // While it runs, the unit that comes next is read ahead: `next` ("": none), by default the
  // next layer's, after the last one the noise refiner's first (the next forward).
  void main_layer(int64_t i, const Tensor& adaln, Activations& act, Compute& cx,
                  float* padding_row = nullptr, const std::string* next = nullptr);
  // The final layer on the image rows, un-patchified: the model output [C, height, width].
  Tensor finish(const Tensor& adaln, Activations& act, Compute& cx, const Observer& observe = {});

  // The pieces of a forward, for a control model (controlnet.h) that runs them on streams of
  // its own, with act's scratch buffers and RoPE table:
  //
  // A grid [C', height, width] of act's layout as patch tokens (rows [0, Nx) of `out`, D wide):
  // patchified as the latents are (pad rows repeating the last token), through the linear layer
  // `embedder` of `unit`, the pad rows then set to x_pad_token. Reports "x_embedder" (before the
  // pad token) and "x_seq_in".
  void embed_patches(const Tensor& grid, const WeightUnit& unit, const std::string& embedder,
                     float* out, Activations& act, Compute& cx, const Observer& observe = {});
  // The latents so, through all_x_embedder: the image rows a forward starts from.
  void embed_image(const Tensor& latents, float* out, Activations& act, Compute& cx,
                   const Observer& observe = {});
  // A block's modulation [4D] for `adaln`, tanh applied to the gates and 1 added to the scales.
  Tensor modulation(const WeightUnit& w, const Tensor& adaln, Compute& cx);
  // One block on rows [row0, row0 + rows) of `stream` ([S, D], act.seq or another); `mod` is
  // the block's [scale_msa | gate_msa | scale_mlp | gate_mlp] or null for an unmodulated block.
  void block(const WeightUnit& w, const float* mod, float* stream, int64_t row0, int64_t rows,
             Activations& act, Compute& cx);

 private:
  void zero_row(const WeightUnit& w, const float* mod, Activations& a, Compute& cx, float* out);
  void attention(const WeightUnit& w, int64_t row0, int64_t rows, Activations& a, Compute& cx);
  void feed_forward(const WeightUnit& w, const float* scale, const float* gate, float* stream,
                    int64_t row0, int64_t rows, Activations& a, Compute& cx);

  WeightStore& store_;
  TransformerConfig config_;
  const Adapters* adapters_ = nullptr;
};

}  // namespace klein::zimage
