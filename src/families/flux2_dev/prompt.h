#pragma once
// The text-encoder input of the FLUX.2-dev pipeline (diffusers' Flux2Pipeline): the prompt as
// the user turn of a Mistral-Small-3.1 chat under the pipeline's fixed system message,
// tokenized, cut or padded to 512 ids, padded with <pad> on the side the tokenizer's
// configuration names.
#include <string>
#include <string_view>

#include "pipeline/stages.h"
#include "tokenizer/chat.h"

namespace klein {

// The pipeline's max_sequence_length: every prompt becomes exactly this many ids.
constexpr int kDevMaxTokens = 512;

// The chat text the pipeline's processor renders for [system, user] with Mistral-Small-3.1's
// template, every "[IMG]" taken out of the prompt first (as the pipeline does):
//   <s>[SYSTEM_PROMPT]{system message}[/SYSTEM_PROMPT][INST]{prompt}[/INST]
std::string dev_chat_text(std::string_view prompt);

// Renders, tokenizes (the control tokens in the text become their ids), keeps the first 512
// ids and pads with <pad> (on the left when tokenizer.pads_left()).
PromptTokens tokenize_dev_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                 int max_tokens = kDevMaxTokens);

// Prompt upsampling as the pipeline does it (Flux2Pipeline.upsample_prompt, BFL's
// text_encoder.upsample_prompt): the same chat with an upsampling system message (BFL's
// SYSTEM_MESSAGE_UPSAMPLING_T2I or _I2I by default), the answer ended by </s> and cleaned up
// as transformers' decode does (clean_up_tokenization), sampled at temperature 0.15 with
// GenerationConfig's default top-k of 50.
//
// The pipeline pads the chat on the left to 2048 ids. The pads are masked out of attention and
// the positions count from the first real token (generate's cumsum of the mask, minus one), so
// every real token sees what it would see without them: the chat runs unpadded, which gives
// the same logits up to the order of float sums (tests/flux2_dev: the reference tokens of
// ../shared/testdata/upsample-mistral) at a seventh of the prefill for a short prompt.
UpsampleChat dev_upsample_chat(const Tokenizer& tokenizer, std::string_view system,
                               std::string_view prompt);
UpsampleStyle dev_upsample_style();

}  // namespace klein
