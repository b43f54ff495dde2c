// libFuzzer target: the model configuration JSON (config.json of each network, the scheduler,
// the container's stored configuration, Z-Image's transformer, text encoder, VAE factors and
// control model,
// the safety classifier's config.json and preprocessor_config.json, and the tensors a parsed
// classifier configuration expects, and both as a container's "safety" metadata holds them) and the precision policy text (globs, PCRE2
// patterns, types), as `klein convert --policy` reads it.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "convert/policy.h"
#include "core/error.h"
#include "families/zimage/prompt.h"
#include "fuzz/fuzz_support.h"
#include "models/zimage/checkpoint/config.h"
#include "models/zimage/checkpoint/controlnet.h"
#include "models/zimage/latents.h"
#include "weights/config.h"
#include "weights/safety_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = klein::fuzz::split<2>(data, size);
  const nlohmann::json j = nlohmann::json::parse(parts[0], nullptr, false);
  if (!j.is_discarded()) {
    auto each = [&](auto parse) {
      try {
        parse();
      } catch (const klein::Error&) {
      }
    };
    each([&] { (void)klein::parse_transformer_config(j, "fuzz"); });
    each([&] { (void)klein::parse_text_encoder_config(j, "fuzz"); });
    each([&] { (void)klein::parse_vae_config(j, "fuzz"); });
    each([&] { (void)klein::parse_scheduler_config(j, "fuzz"); });
    each([&] { (void)klein::model_config_from_json(j, "fuzz"); });
    each([&] { (void)klein::zimage::parse_transformer_config(j, "fuzz"); });
    each([&] { (void)klein::zimage::parse_text_encoder_config(j, "fuzz"); });
    each([&] { (void)klein::zimage::parse_latent_scale(j, "fuzz"); });
    // A control model's config.json against Turbo's transformer, and the tensors it expects.
    each([&] {
      const klein::zimage::TransformerConfig base;
      (void)klein::zimage::expected_controlnet(
          klein::zimage::parse_controlnet_config(j, "fuzz", base), base);
    });
    each([&] { (void)klein::expected_safety_tensors(klein::parse_vit_config(j, "fuzz")); });
    each([&] { (void)klein::parse_vit_image_processor(j, "fuzz"); });
    // A container metadata's "safety" object (klein convert --safety-model).
    each([&] { (void)klein::safety_model_from_metadata(j, "fuzz"); });
  }
  try {
    const auto policy = klein::convert::PrecisionPolicy::with_user_rules(parts[1], "fuzz");
    for (const char* name : {"transformer.transformer_blocks.0.attn.to_q.weight",
                             "text_encoder.model.layers.3.mlp.down_proj.weight", "vae.bn.running_mean"})
      (void)policy.choose(name, {64, 64}, klein::DType::Q4);
  } catch (const klein::Error&) {
  }
  return 0;
}
