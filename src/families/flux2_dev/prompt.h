#pragma once
// The text-encoder input of the FLUX.2-dev pipeline (diffusers' Flux2Pipeline): the prompt as
// the user turn of a Mistral-Small-3.1 chat under the pipeline's fixed system message,
// tokenized, cut or padded to 512 ids, padded with <pad> on the side the tokenizer's
// configuration names.
#include <string>
#include <string_view>

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

}  // namespace klein
