#pragma once
// The FLUX.2 transformer (Flux2Transformer2DModel): one forward over a token list of text,
// target image tokens and any number of reference-image token groups, returning the flow
// velocity of the target tokens. The math is in transformer.cpp.
//
// What depends on what, and therefore how often it is computed:
//   per generation   RopeTable (ids only), embed_text (the prompt), embed_references
//                    (clean reference latents), Activations (sizes only)
//   per step         Modulation (σ only): timestep embedding and every shift/scale/gate,
//                    shared by the conditional and unconditional passes of CFG
//   per forward      the noisy target tokens through every block
// The sampler does everything that reads the unit "transformer.shared" (the embedders, all
// steps' modulation) up front and then releases it: forward() reads only the block units and
// its own copies of the two small weights it needs every time (keep_io_weights).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "ops/work.h"
#include "models/flux2/positions.h"
#include "weights/lora.h"
#include "weights/weight_store.h"

namespace klein::flux2 {

// Every σ-dependent vector of one step (D = inner dim). Allocated once, refilled per step.
struct Modulation {
  explicit Modulation(const TransformerConfig& config);

  Tensor temb;    // [D]   timestep embedding (time_guidance_embed output)
  Tensor img;     // [6D]  double blocks, image stream: shift1 scale1 gate1 shift2 scale2 gate2
  Tensor txt;     // [6D]  double blocks, text stream, same order
  Tensor single;  // [3D]  single blocks: shift scale gate
  Tensor out;     // [2D]  norm_out: scale shift (diffusers order)
  // Scratch of the embedding MLP.
  Tensor sinusoid;  // [timestep_channels]
  Tensor hidden;    // [D]
};

// Activation memory of one generation (or of a batch of `images` generations of the same
// layout), planned from the token counts and reused by every block of every step (nothing is
// allocated inside the step loop). S = T + N tokens per image, B = images.
//   Rows of the [B·S, D] buffers: the text rows of every image first (image b at b·T), then
//   the image rows (target and references) of every image (image b at B·T + b·N). With B = 1
//   that is the joint sequence [text | target | references]; with more, each stream's rows of
//   all images are contiguous, so that a projection reads its weights once for all of them.
//   Attention is per image: its Q, K, V rows are gathered into one_q, one_k, one_v ([S, D],
//   K and V [S + cached, D]) and its output scattered back from one_attn (B > 1 only). Each
//   image's rows get the bits they get alone: every product over stacked rows is at least
//   ops::kSamePathRows long, and a double block's image stream shorter than that (a small
//   image) is projected image by image.
//   stream  [B·S, D]      the residual stream, text rows first ([C; X] of the paper)
//   normed  [S, D]        modulated LayerNorm of the stream (block input)
//   q, k, v [S, D]        attention inputs, heads side by side (head h = columns [128h, 128h+128))
//   attn    [S, D]        attention output
//   After attention every row is independent, so the output projections and the MLPs run on
//   chunks of `chunk_rows` rows (a rest shorter than ops::kSamePathRows joins the chunk
//   before it, so that no product is short enough to change the kernels' path: chunk_at);
//   their buffers are sized by the longest chunk, not by S:
//   mlp_in  [chunk, 2F]   gate | up projections
//   mlp_cat [chunk, D+F]  [attention | silu(gate)·up], the single blocks' to_out input
//                          (the double blocks use its columns [D, D+F) for the MLP activation)
//   proj    [chunk, D]    an output projection before its gate
// The fused single-block projection is never materialised as [S, 3D + 2F]: Q, K and V are
// projected for all rows (attention needs them), gate/up chunk by chunk afterwards.
struct Activations {
  // Default chunk: large enough for efficient matrix products (each chunk re-reads the MLP
  // weights), small enough that the MLP buffers stay a fraction of the [S, D] buffers.
  static constexpr int64_t kDefaultChunkRows = 512;

  // cached_rows: rows of reference keys/values (ReferenceKV) that attention appends to K and V,
  // so k and v are [S + cached_rows, D]. A layout of references alone (no text, an empty
  // target) is the reference pass of the K/V cache.
  Activations(const TransformerConfig& config, const TokenLayout& layout,
              int64_t chunk_rows = kDefaultChunkRows, int64_t cached_rows = 0,
              int64_t images = 1);
  // Bytes the plan needs, without allocating (for memory budgets before a generation).
  static size_t plan_bytes(const TransformerConfig& config, const TokenLayout& layout,
                           int64_t chunk_rows = kDefaultChunkRows, int64_t cached_rows = 0,
                           int64_t images = 1);
  // Bytes held.
  size_t bytes() const;

  // The first row of image b's text rows, and of its image rows (target, then references).
  int64_t text_row(int64_t b) const { return b * layout.text_tokens; }
  int64_t image_row(int64_t b) const {
    return images * layout.text_tokens + b * layout.image_tokens();
  }
  int64_t rows() const { return images * layout.total_tokens(); }
  // The rows of the chunk that starts `done` rows into a run of `rows`.
  int64_t chunk_at(int64_t done, int64_t rows) const;

  TokenLayout layout;
  int64_t chunk_rows;
  int64_t cached_rows = 0;
  int64_t images = 1;
  Tensor stream, normed, q, k, v, attn;
  Tensor one_q, one_k, one_v, one_attn;  // B > 1: one image's attention (empty otherwise)
  Tensor mlp_in, mlp_cat, proj;
  Tensor head_norm;  // [head_dim] the Q/K RMSNorm weight being applied, as float32
};

// Intermediate values for tests and debugging: called with a name and a row-major tensor
// ("x_embedder", "transformer_blocks.{i}.txt", "transformer_blocks.{i}.img",
// "single_transformer_blocks.{i}", "norm_out"). The data is only valid during the call.
using Observer = std::function<void(std::string_view name, const float* data, const Shape& shape)>;

// One reference image as the transformer sees it: packed latent tokens [rows·cols, 128]
// (normalised VAE latents, row-major) and their grid.
struct ReferenceTokens {
  const Tensor* tokens = nullptr;
  LatentGrid grid;
};

// The reference K/V cache of FLUX.2-klein-9b-kv (diffusers' Flux2KleinKVPipeline): the keys
// and values of the reference tokens at every block, after RoPE, blocks in unit order (double
// blocks first), each [R, D]. The reference tokens attend only to each other and are modulated
// at timestep 0, so these depend on the references alone: computed once per generation, and
// the text and target rows of every step attend to them as extra keys and values.
struct ReferenceKV {
  int64_t tokens = 0;  // R
  std::vector<Tensor> keys, values;

  size_t bytes() const { return plan_bytes(keys.size(), tokens, tokens ? keys[0].dim(1) : 0); }
  static size_t plan_bytes(size_t blocks, int64_t tokens, int64_t inner_dim) {
    return 2 * blocks * size_t(tokens) * size_t(inner_dim) * sizeof(float);
  }
};

// The multiply-adds of one forward over `layout` (klein bench step): per step the timestep
// (and guidance) embedding and the four modulation vectors, x_embedder and proj_out on the target rows, and in every block the
// projections and the MLP on the rows that use them (a double block's text weights on the text
// rows, its image weights on the image rows; a single block's on all) and joint attention
// over all rows (plus `cached_rows` reference keys). embed_text is once per prompt: not counted.
ops::ForwardWork forward_work(const TransformerConfig& config, const TokenLayout& layout,
                              int64_t cached_rows = 0);

class Transformer {
 public:
  // Checks the configuration against what this implementation supports; weights are
  // acquired from the store block by block during each forward. Attention runs on bf16
  // tiles when the context's arithmetic says so (Compute::arithmetic.bf16_attention).
  // `adapters` (may be null; must outlive the object): LoRA updates added beside every
  // linear weight they name.
  explicit Transformer(WeightStore& store, const Adapters* adapters = nullptr);

  const TransformerConfig& config() const { return config_; }

  // context_embedder · context: [T, context_dim] → [T, D]. Once per prompt.
  Tensor embed_text(const Tensor& context, Compute& cx);
  // x_embedder · tokens of every reference, in order: → [Σ tokens, D]. Once per generation.
  Tensor embed_references(std::span<const ReferenceTokens> references, Compute& cx);
  // Timestep embedding and all modulation vectors for the timestep the pipeline passes
  // (σ-like: schedule timestep / 1000; the model multiplies by 1000 itself). A model with a
  // guidance embedder (FLUX.2-dev, config guidance_embeds) adds the embedding of `guidance`
  // (the guidance scale as the pipeline passes it; required for such a model, ignored by
  // the others).
  void modulate(float timestep, Modulation& out, Compute& cx,
                std::optional<float> guidance = std::nullopt);
  // Copies x_embedder and proj_out (3072 x 128 each for klein-4B, bytes as stored) out of
  // "transformer.shared", so that forward() does not acquire it. forward() calls it the first
  // time if nobody did.
  void keep_io_weights();

  // One image of a batched forward: its noisy target tokens [N_img, in_channels], its
  // embedded text [T, D] and where its velocity [N_img, out_channels] goes.
  struct Lane {
    const float* latents = nullptr;
    const Tensor* text = nullptr;
    float* velocity = nullptr;
  };

  // The velocity of the target tokens, [N_img, out_channels] into `velocity`.
  //   latents     [N_img, in_channels] noisy target tokens
  //   text        embed_text output [T, D]
  //   references  embed_references output [N_ref, D] (ignored when the layout has none)
  // The layout is that of `act`; `rope` must have been built from the same layout's ids.
  //   cached      reference keys and values every block also attends to (the K/V pipeline;
  //               then the layout has no references and act was planned with
  //               cached_rows = cached->tokens)
  void forward(const float* latents, const Tensor& text, const Tensor* references,
               const Modulation& mod, const RopeTable& rope, Activations& act, float* velocity,
               Compute& cx, const Observer& observe = {}, const ReferenceKV* cached = nullptr);
  // The same forward for a batch of images that share the layout, the modulation (one
  // timestep), the references and their K/V cache: each block is acquired once for all of
  // them and each projection runs once over all their rows (act planned with images =
  // lanes.size()). Every image's velocity is the one forward() gives it alone, bit for bit.
  // The observer is for one image only.
  void forward(std::span<const Lane> lanes, const Tensor* references, const Modulation& mod,
               const RopeTable& rope, Activations& act, Compute& cx,
               const Observer& observe = {}, const ReferenceKV* cached = nullptr);

  // The K/V cache of the references: their embedded tokens (embed_references, [R, D]) run
  // alone through every block, with the image-stream weights in the double blocks, modulated
  // by `at_zero` (modulate(0)), attending only to themselves; each block's keys and values
  // after RoPE are kept. Reads the block units only.
  ReferenceKV cache_references(const Tensor& references, std::span<const LatentGrid> grids,
                               const Modulation& at_zero, Compute& cx);

 private:
  struct Stream;
  // What attention does with the K/V cache in one block: keep this block's keys and values
  // (the reference pass), or attend to the cached ones too (the steps).
  struct BlockKV {
    Tensor* keep_keys = nullptr;
    Tensor* keep_values = nullptr;
    const Tensor* keys = nullptr;
    const Tensor* values = nullptr;
  };
  void run_block(int64_t index, const Modulation& mod, const RopeTable& rope, Activations& a,
                 const BlockKV& kv, Compute& cx);
  void double_block(const WeightUnit& w, const Modulation& mod, const RopeTable& rope,
                    Activations& a, const BlockKV& kv, Compute& cx);
  void single_block(const WeightUnit& w, const Modulation& mod, const RopeTable& rope,
                    Activations& a, const BlockKV& kv, Compute& cx);
  void attention(const RopeTable& rope, Activations& a, const BlockKV& kv, Compute& cx);
  void attend_one(const RopeTable& rope, float* q, float* k, float* v, float* out,
                  int64_t cached_rows, const BlockKV& kv, Compute& cx);
  void finish_stream_rows(const Stream& s, Activations& a, Compute& cx);
  void check_stream(const Activations& a, int64_t n, int64_t block, Compute& cx) const;
  // Every projection of the model: the weight's product plus its LoRA updates.
  void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
              Compute& cx) const;
  void linear(const float* x, int64_t M, const Weight& w, float* y, Compute& cx) const;
  void linear_rows(const float* x, int64_t M, const Weight& w, int64_t begin, int64_t end,
                   float* y, Compute& cx) const;
  void add_updates(const float* x, int64_t M, int64_t ldx, const Weight& w, int64_t begin,
                   int64_t end, float* y, int64_t ldy, Compute& cx) const;

  // A weight whose bytes this object owns (page-aligned, as stored).
  struct OwnedWeight {
    Weight weight;
    std::shared_ptr<std::byte> bytes;
  };
  static OwnedWeight copy_weight(const Weight& w);

  WeightStore& store_;
  TransformerConfig config_;
  const Adapters* adapters_ = nullptr;
  std::vector<std::string> block_units_;  // the blocks' unit names, double blocks first
  std::optional<OwnedWeight> x_embedder_, proj_out_;
};

}  // namespace klein::flux2
