#pragma once
// The text conditioning of the Z-Image pipeline (diffusers ZImagePipeline._encode_prompt):
//   the prompt as one user message in the Qwen3 chat template, with the generation prompt and
//   enable_thinking=True, which in that template adds no <think> block:
//     <|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n
//   tokenized and cut to 512 tokens (a longer text loses its end, template tail included);
//   the text encoder's hidden_states[-2] of the real tokens only: the output of decoder layer
//   N - 1 of N (1-based), before any final norm. Padding changes nothing (causal attention,
//   right padding), so only the real tokens are run.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "weights/config.h"

namespace klein::zimage {

constexpr int kMaxPromptTokens = 512;

std::string chat_text(std::string_view prompt);

// The real tokens of the prompt (ids [0, real_tokens)); `warning` says what a cut dropped.
PromptTokens tokenize_prompt(const Tokenizer& tokenizer, std::string_view prompt);

// The decoder layer (1-based) whose output conditions the transformer, for a text encoder of
// `num_layers` layers: hidden_states[-2].
inline std::vector<int64_t> text_output_layers(int64_t num_layers) { return {num_layers - 1}; }

// The text encoder's config.json with Z-Image's output layer.
TextEncoderConfig parse_text_encoder_config(const nlohmann::json& j, const std::string& where);

}  // namespace klein::zimage
