#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/testing.h"
#include "weights/config.h"
#include "weights/expected.h"
#include "weights/model_source.h"

namespace klein {
namespace {

TEST(TinyModel, LoadsWithConfigsFromItsFiles) {
  auto store = open_model(testing::tiny_model());
  const ModelConfig& c = store->config();
  EXPECT_EQ(c.transformer.num_double_blocks, 2);
  EXPECT_EQ(c.transformer.num_single_blocks, 2);
  EXPECT_EQ(c.transformer.num_heads, 2);
  EXPECT_EQ(c.transformer.inner_dim(), 256);
  EXPECT_EQ(c.transformer.context_dim, 192);
  EXPECT_EQ(c.text_encoder.hidden, 64);
  EXPECT_EQ(c.text_encoder.num_layers, 28);
  EXPECT_EQ(c.text_encoder.num_kv_heads, 2);
  EXPECT_EQ(c.text_encoder.head_dim, 32);
  EXPECT_EQ(c.vae.block_out_channels, (std::vector<int64_t>{32, 32, 64, 64}));
  EXPECT_TRUE(c.is_distilled);
  EXPECT_TRUE(c.scheduler.use_dynamic_shifting);
}

TEST(TinyModel, EveryTensorHasTheSpecShape) {
  auto store = open_model(testing::tiny_model());
  const ModelConfig& c = store->config();
  ShapeMap expected = expected_transformer(c.transformer);
  for (auto& [k, v] : expected_text_encoder(c.text_encoder)) expected[k] = v;
  for (auto& [k, v] : expected_vae(c.vae)) expected[k] = v;
  // Spec b.1: 9 shared tensors, 16 per double block, 4 per single block (169 for klein-4B).
  EXPECT_EQ(expected_transformer(c.transformer).size(), size_t(9 + 2 * 16 + 2 * 4));
  EXPECT_EQ(expected_transformer(TransformerConfig{}).size(), 169u);
  size_t seen = 0;
  for (const auto& unit : store->units()) {
    UnitRef u = store->acquire(unit);
    for (const Weight& w : u->weights()) {
      auto it = expected.find(w.name);
      if (it == expected.end()) continue;  // layers past 27, final norm: present, unused
      EXPECT_EQ(w.shape, it->second) << w.name;
      EXPECT_EQ(w.dtype, DType::BF16) << w.name;
      ++seen;
    }
  }
  EXPECT_EQ(seen, expected.size());
}

TEST(TinyModel, UnitsHaveTheDocumentedNames) {
  auto store = open_model(testing::tiny_model());
  for (const char* unit : {"transformer.shared", "transformer.double.0", "transformer.double.1",
                           "transformer.single.1", "text_encoder.embed", "text_encoder.layer.26",
                           "vae.encoder", "vae.decoder", "vae.latent_stats"})
    EXPECT_TRUE(store->has_unit(unit)) << unit;
  UnitRef d = store->acquire("transformer.double.1");
  EXPECT_EQ(d->get("attn.to_q.weight").shape, (Shape{256, 256}));
  EXPECT_THROW(d->get("attn.no_such.weight"), Error);
  EXPECT_THROW(store->acquire("transformer.double.9"), Error);
}

// An integer field given as a float is refused, not truncated; one too large for any integer
// (found by fuzz/fuzz_config: undefined behaviour in the conversion) likewise.
TEST(Config, IntegerFieldsMustBeJsonIntegers) {
  for (const char* text : {R"({"num_layers": 2.5})", R"({"num_layers": 1e102})",
                           R"({"axes_dims_rope": [32, 32, 32.0, 32]})"}) {
    const std::string error = testing::error_of(
        [&] { parse_transformer_config(nlohmann::json::parse(text), "config.json"); });
    EXPECT_NE(error.find("has the wrong type"), std::string::npos) << text << ": " << error;
  }
  EXPECT_NE(testing::error_of([] {
              parse_scheduler_config(nlohmann::json::parse(R"({"num_train_timesteps": 1e40})"),
                                     "scheduler_config.json");
            }).find("num_train_timesteps"),
            std::string::npos);
}

// Checkpoints without a config file are measured from their names: the distinct block
// indices count, non-numeric parts do not, and an index no model has (a 20-digit one
// overflowed the parse) is refused naming the tensor.
TEST(ExpectedTensors, CountsIndexedBlocksAndRefusesImpossibleIndices) {
  const std::string p = "transformer.layers.";
  ShapeMap m = {{p + "0.attention.weight", {4}}, {p + "0.norm.weight", {4}},
                {p + "2.norm.weight", {4}},      {p + "1.norm.weight", {4}},
                {p + "x.norm.weight", {4}},      {"transformer.layers_extra.7.weight", {4}}};
  EXPECT_EQ(count_indexed(m, p, "model.safetensors"), 3);
  EXPECT_EQ(count_indexed(m, "transformer.noise_refiner.", "model.safetensors"), 0);
  for (const std::string index : {"99999999999999999999", "1000001"}) {
    ShapeMap bad = m;
    bad[p + index + ".norm.weight"] = {4};
    const std::string error =
        testing::error_of([&] { count_indexed(bad, p, "model.safetensors"); });
    EXPECT_NE(error.find("model.safetensors: tensor " + p + index + ".norm.weight"),
              std::string::npos)
        << error;
  }
}

}  // namespace
}  // namespace klein
