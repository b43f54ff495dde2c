// A FLUX.2-dev diffusers directory as the weights layer reads it: the family from
// model_index.json (Flux2Pipeline), the Mistral3 text encoder's language model under the
// canonical names with its vision tower and projector left unread, the guidance embedder in
// the transformer's expected tensors, and the pipeline's configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "flux2_dev/dev_tiny.h"
#include "support/testing.h"
#include "weights/family.h"
#include "weights/model_source.h"
#include "weights/source_store.h"

namespace klein::testing {
namespace {

TEST(DevCheckpoint, DirectoryOpensAsFlux2Dev) {
  std::unique_ptr<WeightStore> store = open_model(dev_dir() / "model");
  const ModelConfig& c = store->config();
  EXPECT_EQ(c.family, "flux2-dev");
  EXPECT_TRUE(c.is_distilled);
  EXPECT_TRUE(c.transformer.guidance_embeds);
  EXPECT_FALSE(c.text_encoder.qk_norm);
  EXPECT_EQ(c.text_encoder.output_layers, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ(c.text_encoder.head_dim, 16);
  EXPECT_EQ(c.transformer.context_dim, c.text_encoder.context_dim());
  // The layers the context reads, and nothing of the vision side.
  EXPECT_TRUE(store->has_unit("text_encoder.layer.29"));
  UnitRef layer = store->acquire("text_encoder.layer.0");
  EXPECT_NO_THROW(layer->get("self_attn.q_proj.weight"));
  UnitRef shared = store->acquire("transformer.shared");
  EXPECT_NO_THROW(shared->get("time_guidance_embed.guidance_embedder.linear_2.weight"));
  const auto& unused = store->origin().unused_tensors;
  EXPECT_TRUE(std::any_of(unused.begin(), unused.end(), [](const std::string& n) {
    return n.find("vision_tower.") != std::string::npos;
  }));
}

TEST(DevCheckpoint, TheTransformerAloneIsRecognisedByItsGuidanceEmbedder) {
  const ModelFamily& dev = model_family("flux2-dev");
  EXPECT_TRUE(dev.recognises_transformer({{"time_guidance_embed.guidance_embedder.linear_1.weight", {4, 4}}}));
  EXPECT_TRUE(dev.recognises_transformer({{"guidance_in.in_layer.weight", {4, 4}}}));
  EXPECT_FALSE(dev.recognises_transformer({{"time_guidance_embed.timestep_embedder.linear_1.weight", {4, 4}}}));
  ModelConfig c = dev_config();
  c.family = "flux2-dev";
  const ShapeMap m = dev.expected_transformer(c);
  EXPECT_EQ(m.count("transformer.time_guidance_embed.guidance_embedder.linear_1.weight"), 1u);
}

TEST(DevCheckpoint, AQwen3TextEncoderIsRefusedWithTheReason) {
  ModelConfig c = dev_config();
  c.family = "flux2-dev";
  c.text_encoder.qk_norm = true;
  const std::string e = error_of([&] {
    model_family("flux2-dev").check_pairing(c, {"transformer.safetensors", "qwen3.safetensors", "vae.safetensors"});
  });
  EXPECT_NE(e.find("Mistral"), std::string::npos) << e;
}

}  // namespace
}  // namespace klein::testing
