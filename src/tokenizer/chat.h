#pragma once
// A chat text as a text encoder reads it: tokenized, cut or padded to a fixed length, with its
// attention mask. What a family's chat template renders (src/families/<family>/prompt.h) comes
// through here; so does Qwen3's chat template for prompt upsampling.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace klein {

struct PromptTokens {
  std::vector<int32_t> ids;   // max_tokens ids, padded with the pad id on the padding's side
  std::vector<int32_t> mask;  // attention mask: 1 for the real tokens, 0 for the padding
  int real_tokens = 0;        // ids that are real tokens (the number of ones in the mask)
  int dropped = 0;            // tokens cut off the end because the text was too long
  int32_t pad_id = -1;        // <|endoftext|>, 151643 for Qwen3 (<pad> for Mistral)
  // Empty unless tokens were dropped; then a sentence for the user saying how many and
  // where the cut fell. The library never prints it; the caller decides.
  std::string warning;
};

// How a rendered chat text is padded to the fixed length: with which token, on which side.
struct ChatPadding {
  std::string_view pad_token = "<|endoftext|>";
  bool left = false;
};

// A rendered chat text, tokenized (control tokens in the text become their ids), truncated on
// the right to `max_tokens` (the end of a long prompt is dropped) and padded as `padding` says.
PromptTokens tokenize_chat_text(const Tokenizer& tokenizer, const std::string& chat_text,
                                int max_tokens, const ChatPadding& padding = {});

// Qwen3's chat template (tokenizer_config.json's, as transformers renders it) for a system
// message (none when empty) and a user message, the assistant's turn opened:
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n
//   <|im_start|>assistant\n   and, with thinking off, <think>\n\n</think>\n\n
// Contents go in verbatim. For prompt upsampling (the text encoder as a chat model).
std::string qwen3_chat_text(std::string_view system, std::string_view user, bool thinking);

// transformers' clean_up_tokenization, which decode() applies where the tokenizer's
// clean_up_tokenization_spaces asks (FLUX.2-dev's upsampling): the space before . ? ! , and
// before the English contractions n't 'm 's 've 're is dropped, and " ' " becomes "'", each
// replacement over the whole text in that order.
std::string clean_up_tokenization(std::string text);

}  // namespace klein
