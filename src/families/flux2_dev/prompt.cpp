#include "families/flux2_dev/prompt.h"

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace klein {

namespace {

// The system message FLUX.2-dev's pipeline encodes every prompt under (diffusers'
// pipelines/flux2/system_messages.py SYSTEM_MESSAGE, from BFL's reference code): part of the
// model's input, so it is reproduced exactly, line break included.
constexpr std::string_view kSystemMessage =
    "You are an AI that reasons about image descriptions. You give structured responses "
    "focusing on object relationships, object\nattribution and actions without speculation.";

// The upsampling system messages of the pipeline (BFL's flux2 src/flux2/system_messages.py at
// 71078ec, which diffusers' pipelines/flux2/system_messages.py repeats at 58eb52c, the commit
// ../shared/testdata/upsample-mistral was made with): for a text-to-image prompt and for an
// edit of reference images. Part of what the model was tuned on, so reproduced exactly.
constexpr std::string_view kUpsampleTextToImage =
    "You are an expert prompt engineer for FLUX.2 by Black Forest Labs. Rewrite user prompts to "
    "be more descriptive while strictly preserving their core subject and intent.\n\n"
    "Guidelines:\n"
    "1. Structure: Keep structured inputs structured (enhance within fields). Convert natural "
    "language to detailed paragraphs.\n"
    "2. Details: Add concrete visual specifics - form, scale, textures, materials, lighting "
    "(quality, direction, color), shadows, spatial relationships, and environmental context.\n"
    "3. Text in Images: Put ALL text in quotation marks, matching the prompt's language. Always "
    "provide explicit quoted text for objects that would contain text in reality (signs, "
    "labels, screens, etc.) - without it, the model generates gibberish.\n\n"
    "Output only the revised prompt and nothing else.";
constexpr std::string_view kUpsampleEdit =
    "You are FLUX.2 by Black Forest Labs, an image-editing expert. You convert editing requests "
    "into one concise instruction (50-80 words, ~30 for brief requests).\n\n"
    "Rules:\n"
    "- Single instruction only, no commentary\n"
    "- Use clear, analytical language (avoid \"whimsical,\" \"cascading,\" etc.)\n"
    "- Specify what changes AND what stays the same (face, lighting, composition)\n"
    "- Reference actual image elements\n"
    "- Turn negatives into positives (\"don't change X\" \u2192 \"keep X\")\n"
    "- Make abstractions concrete (\"futuristic\" \u2192 \"glowing cyan neon, metallic panels\")\n"
    "- Keep content PG-13\n\n"
    "Output only the final instruction in plain text and nothing else.";

// Mistral-Small-3.1's template for [system, user], every "[IMG]" taken out of the user's text.
std::string mistral_chat(std::string_view system, std::string_view prompt) {
  std::string user(prompt);
  for (size_t at; (at = user.find("[IMG]")) != std::string::npos;) user.erase(at, 5);
  std::string text = "<s>[SYSTEM_PROMPT]";
  text += system;
  text += "[/SYSTEM_PROMPT][INST]";
  text += user;
  text += "[/INST]";
  return text;
}

}  // namespace

std::string dev_chat_text(std::string_view prompt) { return mistral_chat(kSystemMessage, prompt); }

UpsampleChat dev_upsample_chat(const Tokenizer& tokenizer, std::string_view system,
                               std::string_view prompt) {
  UpsampleChat chat;
  chat.ids = tokenizer.encode(mistral_chat(system, prompt));
  const int32_t eos = tokenizer.token_id("</s>");
  check(eos >= 0, "the tokenizer has no </s>: not FLUX.2-dev's Mistral tokenizer, cannot upsample");
  chat.stop = {eos};
  chat.clean_up_spaces = true;
  return chat;
}

UpsampleStyle dev_upsample_style() {
  UpsampleStyle s;
  s.text_to_image_system = kUpsampleTextToImage;
  s.edit_system = kUpsampleEdit;
  s.sample = true;
  s.temperature = 0.15f;
  s.top_k = 50;
  s.top_p = 1.0f;
  return s;
}

PromptTokens tokenize_dev_prompt(const Tokenizer& tokenizer, std::string_view prompt,
                                 int max_tokens) {
  return tokenize_chat_text(tokenizer, dev_chat_text(prompt), max_tokens,
                            ChatPadding{"<pad>", tokenizer.pads_left()});
}

}  // namespace klein
