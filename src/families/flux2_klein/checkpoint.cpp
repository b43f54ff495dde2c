#include "families/flux2_klein/checkpoint.h"

namespace klein {

std::vector<ModelFamily::PublishedModel> Flux2Klein::published_models() const {
  return {{"4b", "FLUX.2-klein-4B (distilled; Qwen3-4B; about 16 GB of BF16 files)"},
          {"4b-base", "its base model (50 steps, CFG)"},
          {"4b-kv", "the 4B declared for the reference K/V cache pipeline"},
          {"9b", "FLUX.2-klein-9B (Qwen3-8B; about 36 GB)"},
          {"9b-base", "its base model"},
          {"9b-kv", "the 9B K/V cache model"}};
}

ModelConfig Flux2Klein::published_config(const std::string& name) const {
  const auto models = published_models();
  check(std::any_of(models.begin(), models.end(), [&](const auto& m) { return m.name == name; }),
        "FLUX.2-klein has no published model \"", name, "\"");
  ModelConfig c;  // the defaults are klein-4B's: 5 + 20 blocks of width 3072, Qwen3-4B
  if (name.starts_with("9b")) {
    // klein-9B (diffusers' scripts/convert_flux2_to_diffusers.py, "klein-9b"): 8 double and
    // 24 single blocks, 32 heads of 128 (width 4096), context 12288 = 3 x Qwen3-8B's 4096.
    c.transformer.num_double_blocks = 8;
    c.transformer.num_single_blocks = 24;
    c.transformer.num_heads = 32;
    c.transformer.context_dim = 12288;
    // Qwen3-8B: 36 layers, 32 query and 8 key/value heads of 128, hidden 4096, MLP 12288.
    c.text_encoder.hidden = 4096;
    c.text_encoder.intermediate = 12288;
    c.text_encoder.num_layers = 36;
    c.text_encoder.num_heads = 32;
    c.text_encoder.num_kv_heads = 8;
    c.text_encoder.head_dim = 128;
  }
  c.is_distilled = !name.ends_with("-base");
  c.reference_cache = name.ends_with("-kv");
  return c;
}

}  // namespace klein
