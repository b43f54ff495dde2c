// The pipeline stages of each model family (stages.h), by ModelConfig::family: the one place
// that maps a family to the code that runs it. The family's checkpoint side is listed in
// weights/family.cpp.
#include "core/error.h"
#include "pipeline/stages.h"

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

const FamilyStages& stages_for(const ModelConfig& config) {
  if (config.family == "flux2-klein") return flux2_stages();
  if (config.family == "flux2-dev") return flux2_dev_stages();
  if (config.family == "z-image") return zimage_stages();
  fail("model family \"", config.family, "\" has no pipeline in this build");
}

Capabilities capabilities(const Model& model) {
  const ModelConfig& config = model.weights->config();
  Capabilities c = stages_for(config).capabilities(config);
  c.family = config.family;
  return c;
}

}  // namespace klein
