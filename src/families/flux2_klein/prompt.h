#pragma once
// The text-encoder input of the FLUX.2-klein pipeline: the user prompt wrapped in the Qwen3
// chat template, tokenized, cut or padded to a fixed length (spec sections 4 and 5).
#include <string>
#include <string_view>

#include "tokenizer/chat.h"

namespace klein {

// The pipeline's max_sequence_length: every prompt becomes exactly this many ids.
constexpr int kKleinMaxTokens = 512;

// The chat-template text for one user message, with the generation prompt and thinking
// switched off, exactly as the pipeline renders it:
//   <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
std::string klein_chat_text(std::string_view prompt);

// Renders, tokenizes, truncates on the right to `max_tokens` and right-pads with
// <|endoftext|>. The prompt is used verbatim (no trimming), like the pipeline does.
PromptTokens tokenize_klein_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                   int max_tokens = kKleinMaxTokens);

}  // namespace klein
