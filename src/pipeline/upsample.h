#pragma once
// Prompt upsampling: the model's own text encoder, run as a chat language model
// (models/qwen3/language_model.h), rewrites a short prompt into a detailed one before it is
// encoded. A system message says what to write (the family's own where its pipeline has one,
// FLUX.2-dev's BFL messages; else ours, default_upsample_system; the caller's instead when
// given), the user's prompt is the user turn of the family's chat (FamilyStages::upsample_chat:
// Qwen3's with thinking switched off; Mistral's for FLUX.2-dev), and the answer is decoded
// without special tokens (and without a <think> block, should a model write one anyway).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "models/qwen3/generate.h"
#include "ops/compute.h"
#include "pipeline/pipeline.h"
#include "pipeline/stages.h"

namespace klein {

struct UpsampleOptions {
  std::string system;         // empty: the family's message, else default_upsample_system(edit)
  bool edit = false;          // the prompt is an instruction to edit reference images
  int max_new_tokens = 512;
  // Sampling as the caller asks for it. None given: the family's default (UpsampleStyle:
  // greedy for the Qwen3 families; FLUX.2-dev samples at temperature 0.15 with top-k 50, as
  // its pipeline does). Any given: sampling, with the family's values for the others; a
  // temperature of 0 is greedy decoding.
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  bool seeded = false;        // the caller gave the seed: sampling too, as any option above
  uint64_t seed = 0;          // for sampling
};

struct UpsampleResult {
  std::string prompt;         // the rewritten prompt
  int prompt_tokens = 0;      // of the chat text
  int new_tokens = 0;         // generated, the stop token included
  bool stopped = false;       // the model ended its answer (else max_new_tokens cut it)
  bool sampled = false;       // drawn with UpsampleOptions::seed (else greedy)
  double prefill_seconds = 0, decode_seconds = 0;
};

// The system messages we ship: for text-to-image prompts, and for edit instructions.
const std::string& default_upsample_system(bool edit);

// The system message and the sampling in effect for `o` with a family's defaults.
std::string upsample_system(const UpsampleOptions& o, const UpsampleStyle& style);
qwen3::SamplingOptions upsample_sampling(const UpsampleOptions& o, const UpsampleStyle& style);

// The model as upsampling needs it: the text encoder and the tokenizer only (a klein
// container whole), so `-m DIR` or `--text-encoder FILE --tokenizer DIR` without a
// transformer or VAE, and no check that a transformer pairs with the text encoder
// (open_text_encoder_model). `klein generate --upsample` opens the whole model instead.
Model open_upsample_model(const ModelPaths& paths);

// Whether the model can upsample; when not, a sentence saying why and what to do.
std::string upsample_unavailable(const Model& model);

// Rewrites `prompt`. on_token (may be empty) is called after each generated token with the
// count so far, for progress. Throws when the model cannot run as a language model or the
// answer is empty.
UpsampleResult upsample_prompt(Model& model, Compute& cx, const std::string& prompt,
                               const UpsampleOptions& o,
                               const std::function<void(int)>& on_token = {});

}  // namespace klein
