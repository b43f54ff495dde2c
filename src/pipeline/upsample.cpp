// Prompt upsampling (upsample.h): chat text -> token ids -> the language model's answer ->
// text. The loop and the token choice are models/qwen3/generate.h.
#include "pipeline/upsample.h"

#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "models/qwen3/language_model.h"
#include "pipeline/model_tokenizer.h"
#include "tokenizer/chat.h"

namespace klein {

const std::string& default_upsample_system(bool edit) {
  static const std::string text_to_image =
      "You turn short requests into detailed prompts for a text-to-image model. Keep the "
      "subject, every detail and any text the user asked for, and their language. Add what "
      "a picture needs to be specific: the setting, the arrangement of things, the light, the "
      "colours and materials, the camera or art style where it fits. Describe only what can "
      "be seen. Do not invent writing in the image that the user did not ask for. Answer with "
      "the prompt alone, as one paragraph of at most 120 words, with no preface or quotes.";
  static const std::string image_edit =
      "You turn short editing requests into precise instructions for an image-editing model "
      "that sees the user's reference images. Keep the intent of the request. Say exactly "
      "what to change, where, and how it should look, and say what must stay as it is "
      "(people, faces, composition, style) unless the request changes it. Refer to the "
      "pictures as the image, or image 1, image 2 when there are several. Answer with the "
      "instruction alone, in at most 80 words, with no preface or quotes.";
  return edit ? image_edit : text_to_image;
}

std::string upsample_system(const UpsampleOptions& o, const UpsampleStyle& style) {
  if (!o.system.empty()) return o.system;
  const std::string_view own = o.edit ? style.edit_system : style.text_to_image_system;
  return own.empty() ? default_upsample_system(o.edit) : std::string(own);
}

qwen3::SamplingOptions upsample_sampling(const UpsampleOptions& o, const UpsampleStyle& style) {
  qwen3::SamplingOptions s;
  const bool given = o.temperature || o.top_p || o.top_k || o.seeded;
  s.temperature = o.temperature.value_or(style.temperature);
  s.top_k = o.top_k.value_or(style.top_k);
  s.top_p = o.top_p.value_or(style.top_p);
  s.sample = given ? s.temperature > 0 : style.sample;
  return s;
}

Model open_upsample_model(const ModelPaths& paths) {
  std::unique_ptr<WeightStore> weights = open_text_encoder_model(paths);
  const std::string needs_conversion = weights->origin().needs_conversion;
  check(needs_conversion.empty(), needs_conversion);
  Tokenizer tokenizer = load_model_tokenizer(paths, weights.get());
  Model m{std::move(weights), std::move(tokenizer), "", ""};
  m.name = m.weights->config().name;
  if (std::filesystem::is_regular_file(paths.model)) m.checksum = m.weights->identity();
  return m;
}

std::string upsample_unavailable(const Model& model) {
  std::string missing;
  if (qwen3::can_generate(*model.weights, &missing)) return "";
  return "this model cannot upsample prompts: its text encoder lacks " + missing +
         " (a container keeps only the layers image generation reads; convert the checkpoint "
         "again with --keep-llm, or upsample from the diffusers directory)";
}

UpsampleResult upsample_prompt(Model& model, Compute& cx, const std::string& prompt,
                               const UpsampleOptions& o,
                               const std::function<void(int)>& on_token) {
  const std::string why = upsample_unavailable(model);
  check(why.empty(), why);
  check(o.max_new_tokens > 0 && o.max_new_tokens <= 4096,
        "--upsample-max-tokens: expected 1 to 4096, got ", o.max_new_tokens);
  const FamilyStages& family = stages_for(model.weights->config());
  const UpsampleStyle style = family.upsample_style();
  const qwen3::SamplingOptions sampling = upsample_sampling(o, style);
  check(sampling.temperature >= 0 && sampling.temperature <= 10,
        "upsampling temperature: expected 0 (greedy) to 10, got ", sampling.temperature);
  check(sampling.top_p > 0 && sampling.top_p <= 1,
        "upsampling top-p: expected a number above 0 and at most 1, got ", sampling.top_p);
  check(sampling.top_k >= 0, "upsampling top-k: expected 0 (off) or more, got ", sampling.top_k);
  const UpsampleChat chat = family.upsample_chat(model.tokenizer, upsample_system(o, style), prompt);

  qwen3::LanguageModel lm(*model.weights, cx, int64_t(chat.ids.size()) + o.max_new_tokens);
  qwen3::TokenPicker picker(sampling, o.seed);
  int count = 0;
  const qwen3::GenerationResult g =
      qwen3::generate(lm, chat.ids, o.max_new_tokens, picker, chat.stop, [&](int32_t) {
        ++count;
        if (on_token) on_token(count);
      });

  std::string text = model.tokenizer.decode(g.ids, /*skip_special=*/true);
  if (chat.clean_up_spaces) text = clean_up_tokenization(text);
  if (const size_t think = text.rfind("</think>"); think != std::string::npos)
    text = text.substr(think + 8);
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.back())) text.pop_back();
  size_t start = 0;
  while (start < text.size() && space(text[start])) ++start;
  text = text.substr(start);
  check(!text.empty(), "prompt upsampling produced no text (", g.ids.size(),
        " tokens): try again with sampling (--upsample-temperature) or without --upsample");

  UpsampleResult r;
  r.prompt = text;
  r.prompt_tokens = int(chat.ids.size());
  r.sampled = sampling.sample;
  r.new_tokens = int(g.ids.size());
  r.stopped = g.stopped;
  r.prefill_seconds = g.prefill_seconds;
  r.decode_seconds = g.decode_seconds;
  return r;
}

}  // namespace klein
