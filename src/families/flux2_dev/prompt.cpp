#include "families/flux2_dev/prompt.h"

namespace klein {

namespace {

// The system message FLUX.2-dev's pipeline encodes every prompt under (diffusers'
// pipelines/flux2/system_messages.py SYSTEM_MESSAGE, from BFL's reference code): part of the
// model's input, so it is reproduced exactly, line break included.
constexpr std::string_view kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses "
    "focusing on object relationships, object\nattribution and actions without speculation.";

}  // namespace

std::string dev_chat_text(std::string_view prompt) {
  std::string user(prompt);
  for (size_t at; (at = user.find("[IMG]")) != std::string::npos;) user.erase(at, 5);
  std::string text = "<s>[SYSTEM_PROMPT]";
  text += kSystemMessage;
  text += "[/SYSTEM_PROMPT][INST]";
  text += user;
  text += "[/INST]";
  return text;
}

PromptTokens tokenize_dev_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                 int max_tokens) {
  return tokenize_chat_text(tokenizer, dev_chat_text(prompt), max_tokens,
                            ChatPadding{"<pad>", tokenizer.pads_left()});
}

}  // namespace klein
