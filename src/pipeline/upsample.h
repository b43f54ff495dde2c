#pragma once
// Prompt upsampling: the model's own text encoder, run as a chat language model
// (models/qwen3/language_model.h), rewrites a short prompt into a detailed one before it is
// encoded. A system message says what to write (ours by default, in default_upsample_system;
// the caller's instead when given), the user's prompt is the user turn, thinking is switched
// off in the template, and the answer is decoded without special tokens (and without a
// <think> block, should a model write one anyway).
#include <cstdint>
#include <functional>
#include <string>

#include "models/qwen3/generate.h"
#include "ops/compute.h"
#include "pipeline/pipeline.h"

namespace klein {

struct UpsampleOptions {
  std::string system;         // empty: default_upsample_system(edit)
  bool edit = false;          // the prompt is an instruction to edit reference images
  int max_new_tokens = 512;
  qwen3::SamplingOptions sampling;  // greedy unless sampling.sample
  uint64_t seed = 0;                // for sampling
};

struct UpsampleResult {
  std::string prompt;         // the rewritten prompt
  int prompt_tokens = 0;      // of the chat text
  int new_tokens = 0;         // generated, the stop token included
  bool stopped = false;       // the model ended its answer (else max_new_tokens cut it)
  double prefill_seconds = 0, decode_seconds = 0;
};

// The system messages we ship: for text-to-image prompts, and for edit instructions.
const std::string& default_upsample_system(bool edit);

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
