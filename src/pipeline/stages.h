#pragma once
// How a model family runs the pipeline's stages (pipeline.h: start, encode_prompt,
// prepare_latents, denoise, decode). A Session holds the stages of its model's family
// (ModelConfig::family), as the family registered them: each family's stages are in its
// folder of src/families (flux2/stages.cpp: FLUX.2-klein's and FLUX.2-dev's, each with what
// its own folder says differs; zimage/stages.cpp: Z-Image's). The front ends see none of this:
// they call the Session.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/memory.h"
#include "ops/work.h"
#include "pipeline/pipeline.h"
#include "tokenizer/chat.h"

namespace klein {

namespace qwen3 {
class TextEncoder;
class PromptCache;
}  // namespace qwen3

// For callers that compare two stores of one model network by network (klein report,
// convert/report/e2e.h): a transformer block in the order the forward runs them, named as
// the checkpoint names it, with the weight-store unit it reads.
struct TransformerBlock {
  std::string name;  // "transformer_blocks.0", "noise_refiner.1", "layers.3"
  std::string unit;  // "transformer.double.0", "transformer.noise_refiner.1", ...
};

// The inputs of one transformer forward, as a generation had them at one step.
struct ProbeInputs {
  const Tensor* latents = nullptr;  // StepView::latents_in
  const Tensor* context = nullptr;  // Generation::context after encode_prompt (the prompt's)
  float timestep = 0;               // StepView::timestep
  LatentGrid grid;           // Generation::grid
  float guidance = 1;               // GenerateResult::guidance (FLUX.2-dev embeds it)
};

// Inputs of the shapes a generation at one size gives the transformer (the longest prompt
// the pipeline takes), filled with standard normal values: for timing a forward, whose time
// depends on the shapes only (klein bench step).
struct SyntheticProbe {
  Tensor latents, context;
  LatentGrid grid;
  ProbeInputs inputs() const { return {&latents, &context, 0.5f, grid, 4.0f}; }
};

// Part of the output of block `block` (an index into transformer_blocks): `count` values that
// lie at `offset` in the block's output over the real tokens (padding rows are not shown),
// valid during the call.
using BlockObserver =
    std::function<void(size_t block, int64_t offset, const float* data, int64_t count)>;

// One prompt through a family's text conditioning (FamilyStages::encode_text).
struct EncodedText {
  PromptTokens tokens;       // the prompt's ids and mask (FamilyStages::prompt_tokens)
  Tensor context;            // [text tokens, context width]: what the transformer attends to
  bool from_cache = false;
  std::string store_error;   // non-empty when the context could not be cached (still valid)
};

// Prompt upsampling (pipeline/upsample.h) as a family's pipeline does it with its text
// encoder run as a chat language model.
struct UpsampleChat {
  std::vector<int32_t> ids;   // the chat the answer follows
  std::vector<int32_t> stop;  // the ids that end the answer
  // transformers' clean_up_tokenization on the decoded answer (" ." -> ".", " 's" -> "'s", ...)
  bool clean_up_spaces = false;
};
// A family's upsampling defaults: its system messages (empty: ours, default_upsample_system)
// and the sampling it runs when the caller gives none.
struct UpsampleStyle {
  std::string_view text_to_image_system, edit_system;
  bool sample = false;       // false: greedy
  float temperature = 0.6f;  // the values sampling takes where the caller gives none
  int top_k = 20;
  float top_p = 0.95f;
};

class FamilyStages {
 public:
  virtual ~FamilyStages() = default;
  // Prompt upsampling: the chat of `system` (the message in effect) and the user's prompt,
  // tokenized. The default is the Qwen3 chat with thinking switched off (FLUX.2-klein, Z-Image).
  virtual UpsampleChat upsample_chat(const Tokenizer& tokenizer, std::string_view system,
                                     std::string_view prompt) const;
  virtual UpsampleStyle upsample_style() const { return {}; }
  // What the family's pipelines take beyond a prompt (for front ends that show only those).
  virtual Capabilities capabilities(const ModelConfig& config) const = 0;
  // The family's part of a memory plan's inputs (the ids every prompt becomes, the width of
  // the context rows, its denoising phases); the caller adds the generation's size, steps,
  // references, guidance and batch.
  virtual MemoryPlanInputs memory_inputs(const ModelConfig& config) const = 0;
  // g.options is set and the common bookkeeping done (peak marks, the model's files); the
  // family fills g.result's sizes, steps, guidance, seed, precision and memory plan, and
  // checks every option it can before any network runs (options it does not support are
  // refused by name).
  virtual void start(Session& s, Generation& g, Progress& progress) const = 0;
  virtual void encode_prompt(Session& s, Generation& g, Progress& progress,
                             const TextLayerHook& on_layer) const = 0;

  // The family's text conditioning, which encode_prompt runs for the prompt and the negative
  // prompt, for front ends that show it alone (klein tokenize --template, klein encode-text).
  //
  // The text the pipeline's chat template renders the prompt to.
  virtual std::string prompt_chat_text(std::string_view prompt) const = 0;
  // Its ids as the pipeline's tokenizer call gives them: cut or padded to the pipeline's
  // length, with the attention mask; `warning` says what a cut dropped.
  virtual PromptTokens prompt_tokens(const Tokenizer& tokenizer, std::string_view prompt) const = 0;
  // Those ids through `encoder` (in the compute context's current arithmetic): the context
  // the transformer receives. Read from `cache` when it holds it, else stored there (`cache`
  // may be null); with `observe`, which sees every layer, the cache is neither read nor
  // written.
  virtual EncodedText encode_text(qwen3::TextEncoder& encoder, const Tokenizer& tokenizer,
                                  std::string_view prompt, qwen3::PromptCache* cache,
                                  const TextLayerHook& observe = {}) const = 0;
  virtual void prepare_latents(Session& s, Generation& g, Progress& progress) const = 0;
  virtual void denoise(Session& s, Generation& g, Progress& progress,
                       const StepHook& on_step) const = 0;
  // Several generations started alike (the same size, steps, guidance, references and LoRAs;
  // prompts and seeds may differ), each with its latents prepared: each ends as denoise()
  // leaves it alone. This default runs them one after the other; a family whose transformer
  // takes a batch (FLUX.2) runs them together, each block once per step for all of them.
  // `on_first` sees the first generation's steps.
  virtual void denoise_batch(Session& s, std::span<Generation* const> batch, Progress& progress,
                             const StepHook& on_first) const {
    for (size_t i = 0; i < batch.size(); ++i)
      denoise(s, *batch[i], progress, i == 0 ? on_first : StepHook());
  }
  virtual void decode(Session& s, Generation& g, Progress& progress) const = 0;

 protected:
  // encode_text as encode_prompt runs it: the session's tokenizer, the generation's prompt
  // cache (null: none), and what it warns of (a prompt cut short, a context that could not be
  // cached) reported on `g`. The context; `from_cache` says where it came from.
  Tensor encode_for(Session& s, Generation& g, Progress& progress, qwen3::TextEncoder& encoder,
                    qwen3::PromptCache* cache, std::string_view text, bool& from_cache,
                    const TextLayerHook& observe) const;
 public:

  // The networks one at a time, outside a generation and in the compute context's current
  // arithmetic, for comparing two stores of the same model block by block (klein report).
  //
  // The transformer's blocks in the order the forward runs them.
  virtual std::vector<TransformerBlock> transformer_blocks(const ModelConfig& config) const = 0;
  // The width of the transformer's stream (what tells a test-sized model from a real one).
  virtual int64_t transformer_width(const ModelConfig& config) const = 0;
  // One conditional forward (the prompt's context, no guidance) at one step, prepared as the
  // sampler prepares its steps (the context embedded, the step's modulation, the weights that
  // live outside the blocks kept), so that each forward() is what one step of a generation
  // runs: the velocity, in the layout of StepView::velocity, and every block's output to
  // `observe` (may be empty). `store`, `in` and `cx` must outlive it.
  class Probe {
   public:
    virtual ~Probe() = default;
    virtual Tensor forward(const BlockObserver& observe) = 0;
  };
  virtual std::unique_ptr<Probe> start_probe(WeightStore& store, const ProbeInputs& in,
                                             Compute& cx) const = 0;
  // One such forward, prepared and run.
  Tensor probe_forward(WeightStore& store, const ProbeInputs& in, Compute& cx,
                       const BlockObserver& observe) const {
    return start_probe(store, in, cx)->forward(observe);
  }
  // Made-up inputs of one forward at `grid` (see SyntheticProbe) and the multiply-adds that
  // forward does.
  virtual SyntheticProbe synthetic_probe(const ModelConfig& config, LatentGrid grid) const = 0;
  virtual ops::ForwardWork forward_work(const ModelConfig& config, LatentGrid grid) const = 0;
  // The VAE decoder alone on the latents denoise leaves (Generation::latents): the decoder's
  // output [3, H, W] in [-1, 1], as Generation::decoded.
  virtual Tensor decode_latents(WeightStore& store, const Tensor& latents,
                                LatentGrid grid, Compute& cx) const = 0;
  // The latents denoise leaves (Generation::latents, or a step's estimate in that layout) as
  // the family's tiny autoencoder takes them (pipeline/tiny_decoder.h), [C, H/8, W/8]:
  // FLUX.2's VAE latent, its statistics undone and its patches unpacked (TAEF2); Z-Image's
  // scaled latents as they are (TAEF1).
  virtual Tensor tiny_decoder_input(WeightStore& store, const Tensor& latents, LatentGrid grid,
                                    Compute& cx) const = 0;
  // The VAE encoder alone on an image [3, H, W] in [-1, 1] (sides multiples of the VAE's pixels
  // per token): the latents of the family's denoising space as an image [C, h, w] (FLUX.2: the
  // normalized patchified latents [128, H/16, W/16]; Z-Image: the scaled [16, H/8, W/8]), the
  // layout `klein vae decode` reads back.
  virtual Tensor encode_image(WeightStore& store, const Tensor& pixels, Compute& cx) const = 0;
};

// Registers the stages of the family of this id (ModelConfig::family): src/families does, for
// each family it registers (families/registry.h). Throws if the id has stages already.
void register_stages(std::string_view family, const FamilyStages& stages);
// The stages of the configuration's family; throws naming a family without stages.
const FamilyStages& stages_for(const ModelConfig& config);

// The output size from the requested one: at least 16 and at most 8192 pixels a side, floored to
// a multiple of `multiple` with a warning naming both sizes. Sets g.result's width and height.
void settle_output_size(Session& s, Generation& g, Progress& progress, int64_t width,
                        int64_t height, int64_t multiple);

// The end of every decode stage: the VAE's units released, the latents dropped, the residency
// peak and the image (`decoded`: [3, H, W] in [-1, 1]) in the result (and the dump), and the
// model's files checked (check_model_files_unchanged).
void finish_decode(Session& s, Generation& g, Tensor decoded);

// Refuses to finish when a model file has changed since start (rewritten or replaced under
// the mapping: the image could mix two models).
void check_model_files_unchanged(const Generation& g);

// Runs one phase: its time, and the peak RSS while it ran, into the result.
template <class Fn>
void Session::timed(Generation& g, Progress& progress, const std::string& name, int total,
                    Fn&& fn) {
  cx_.stop_if_cancelled();
  return_free_memory();  // what the previous phase freed
  const bool exact = reset_peak_rss();
  const uint64_t start_rss = current_rss_bytes();
  {
    Phase phase(progress, name, total);
    fn(phase);
    g.result.timings.emplace_back(name, phase.seconds());
  }
  g.result.phase_memory.push_back(
      {name, start_rss, exact ? peak_rss_since_reset() : peak_rss_bytes(), exact});
}

}  // namespace klein
