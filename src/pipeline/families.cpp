// The pipeline stages of each model family (stages.h), by ModelConfig::family, as the
// families registered them (src/families/registry.cpp).
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_fields.h"
#include "pipeline/stages.h"
#include "tokenizer/tokenizer.h"

namespace klein {

Tensor FamilyStages::encode_for(Session& s, Generation& g, Progress& progress,
                                qwen3::TextEncoder& encoder, qwen3::PromptCache* cache,
                                std::string_view text, bool& from_cache,
                                const TextLayerHook& observe) const {
  EncodedText e = encode_text(encoder, s.tokenizer(), text, cache, observe);
  if (!e.tokens.warning.empty()) s.warn(g, progress, e.tokens.warning);
  if (!e.store_error.empty()) s.warn(g, progress, "prompt cache: " + e.store_error);
  from_cache = e.from_cache;
  return std::move(e.context);
}

UpsampleChat FamilyStages::upsample_chat(const Tokenizer& tokenizer, std::string_view system,
                                         std::string_view prompt) const {
  UpsampleChat chat;
  chat.ids = tokenizer.encode(qwen3_chat_text(system, prompt, /*thinking=*/false));
  // The turn ends at <|im_end|>; <|endoftext|> ends a document (Qwen3's eos_token_id list).
  for (const char* name : {"<|im_end|>", "<|endoftext|>"})
    if (const int32_t id = tokenizer.token_id(name); id >= 0) chat.stop.push_back(id);
  check(!chat.stop.empty(), "the tokenizer has neither <|im_end|> nor <|endoftext|>: not a Qwen3 "
        "chat tokenizer, cannot upsample");
  return chat;
}

namespace {

std::map<std::string, const FamilyStages*, std::less<>>& registered_stages() {
  static std::map<std::string, const FamilyStages*, std::less<>> all;
  return all;
}

}  // namespace

void register_stages(std::string_view family, const FamilyStages& stages) {
  check(registered_stages().emplace(std::string(family), &stages).second, "model family \"", family,
        "\" has its stages registered twice");
}

const FamilyStages& stages_for(const ModelConfig& config) {
  const auto it = registered_stages().find(config.family);
  check(it != registered_stages().end(), "model family \"", config.family,
        "\" has no pipeline in this program");
  return *it->second;
}

Capabilities capabilities(const Model& model) {
  const ModelConfig& config = model.weights->config();
  Capabilities c = stages_for(config).capabilities(config);
  c.family = config.family;
  const StoreOrigin origin = model.weights->origin();
  const nlohmann::json* meta = origin.container_metadata;
  c.stored_control_model = c.control && meta && meta->contains("controlnet");
  if (meta && meta->contains("tiny_vae")) {
    c.stored_tiny_decoder = "tiny_vae";
    read_json_field((*meta)["tiny_vae"], "source", c.stored_tiny_decoder,
                    (origin.files.empty() ? std::string("the container") : origin.files[0].string()) +
                        ": metadata \"tiny_vae\"");
  }
  return c;
}

}  // namespace klein
