#include "families/zimage/prompt.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace klein::zimage {

std::string chat_text(std::string_view prompt) {
  std::string text = "<|im_start|>user\n";
  text.append(prompt);
  text += "<|im_end|>\n<|im_start|>assistant\n";
  return text;
}

PromptTokens tokenize_prompt(const Tokenizer& tokenizer, std::string_view prompt) {
  return tokenize_chat_text(tokenizer, chat_text(prompt), kMaxPromptTokens);
}

TextEncoderConfig parse_text_encoder_config(const nlohmann::json& j, const std::string& where) {
  check(j.is_object() && j.contains("num_hidden_layers") &&
            j.at("num_hidden_layers").is_number_integer() &&
            j.at("num_hidden_layers").get<int64_t>() >= 2,
        where,
        ": expected num_hidden_layers, an integer of at least 2 (Z-Image reads the output "
        "of the last layer but one)");
  return klein::parse_text_encoder_config(
      j, where, text_output_layers(j.at("num_hidden_layers").get<int64_t>()));
}

}  // namespace klein::zimage
