#include "families/flux2_klein/prompt.h"

namespace klein {

std::string klein_chat_text(std::string_view prompt) {
  std::string text = "<|im_start|>user\n";
  text.append(prompt);
  text += "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
  return text;
}

PromptTokens tokenize_klein_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                   int max_tokens) {
  return tokenize_chat_text(tokenizer, klein_chat_text(prompt), max_tokens);
}

}  // namespace klein
