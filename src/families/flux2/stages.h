#pragma once
// The pipeline stages FLUX.2-klein and FLUX.2-dev share (families/flux2/stages.cpp): the same
// transformer, VAE, sampler and token layout; what differs is the text conditioning, the
// guidance and which image inputs the pipeline takes. Each family's folder gives its own.
#include <memory>
#include <string>
#include <string_view>

#include "pipeline/stages.h"
#include "tokenizer/chat.h"

namespace klein {

// What differs between the FLUX.2 pipelines: klein's (Flux2KleinPipeline and its
// image-to-image, inpainting and K/V siblings: a Qwen3 chat, CFG for base models) and dev's
// (Flux2Pipeline: a Mistral-Small-3.1 chat under a system message, the guidance scale embedded
// in the model, text-to-image and references only).
struct Flux2Pipeline {
  const char* name;
  std::string (*chat_text)(std::string_view);
  PromptTokens (*tokenize)(const Tokenizer&, std::string_view, int);
  int max_tokens;          // every prompt becomes this many ids (max_sequence_length)
  bool image_to_image;     // --init-image, --mask
  bool embedded_guidance;  // the guidance goes to the model; no negative prompt
  // Prompt upsampling: the pipeline's own chat and defaults (null, {}: the Qwen3 chat and ours).
  UpsampleChat (*upsample_chat)(const Tokenizer&, std::string_view system,
                                std::string_view prompt) = nullptr;
  UpsampleStyle (*upsample_style)() = nullptr;
};

// The stages of one FLUX.2 pipeline (`pipeline` must outlive them: a constant of its family).
std::unique_ptr<FamilyStages> flux2_stages(const Flux2Pipeline& pipeline);

}  // namespace klein
