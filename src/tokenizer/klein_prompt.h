#pragma once
// The text-encoder input of the FLUX.2-klein pipeline: the user prompt wrapped in the Qwen3
// chat template, tokenized, cut or padded to a fixed length (spec sections 4 and 5).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace klein {

// The pipeline's max_sequence_length: every prompt becomes exactly this many ids.
constexpr int kKleinMaxTokens = 512;

struct KleinPromptTokens {
  std::vector<int32_t> ids;   // max_tokens ids, padded with the pad id (klein: on the right)
  std::vector<int32_t> mask;  // attention mask: 1 for the real tokens, 0 for the padding
  int real_tokens = 0;        // ids that are real tokens (the number of ones in the mask)
  int dropped = 0;            // tokens cut off the end because the text was too long
  int32_t pad_id = -1;        // <|endoftext|>, 151643 for Qwen3 (<pad> for Mistral)
  // Empty unless tokens were dropped; then a sentence for the user saying how many and
  // where the cut fell. The library never prints it; the caller decides.
  std::string warning;
};

// The chat-template text for one user message, with the generation prompt and thinking
// switched off, exactly as the pipeline renders it:
//   <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n
std::string klein_chat_text(std::string_view prompt);

// Qwen3's chat template (tokenizer_config.json's, as transformers renders it) for a system
// message (none when empty) and a user message, the assistant's turn opened:
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
//   <|im_start|>assistant\n   and, with thinking off, <think>\n\n</think>\n\n
// Contents go in verbatim. For prompt upsampling (the text encoder as a chat model).
std::string qwen3_chat_text(std::string_view system, std::string_view user, bool thinking);

// Renders, tokenizes, truncates on the right to `max_tokens` and right-pads with
// <|endoftext|>. The prompt is used verbatim (no trimming), like the pipeline does.
KleinPromptTokens tokenize_klein_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                        int max_tokens = kKleinMaxTokens);

// How a rendered chat text is padded to the fixed length: with which token, on which side.
struct ChatPadding {
  std::string_view pad_token = "<|endoftext|>";
  bool left = false;
};

// The same for an already rendered chat text (another pipeline's template): truncated on the
// right (the end of a long prompt is dropped), padded as `padding` says.
KleinPromptTokens tokenize_chat_text(const Tokenizer& tokenizer, const std::string& chat_text,
                                     int max_tokens = kKleinMaxTokens,
                                     const ChatPadding& padding = {});

}  // namespace klein
