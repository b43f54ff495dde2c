#include <gtest/gtest.h>

#include "support/testing.h"
#include "weights/model_source.h"
#include "bench/support/synthetic.h"

namespace klein {
namespace {

// The synthetic writer and the loader agree on names, shapes, shards and configs: a small
// configuration written by write_synthetic_model opens through the normal discovery path.
TEST(SyntheticModel, SmallConfigurationLoadsLikeARealCheckpoint) {
  SyntheticModelOptions o;
  o.out_dir = testing::temp_dir("synth") / "model";
  o.tokenizer_dir = testing::tiny_model() / "tokenizer";
  o.config.transformer.num_double_blocks = 1;
  o.config.transformer.num_single_blocks = 2;
  o.config.transformer.num_heads = 2;
  o.config.transformer.context_dim = 3 * 64;
  o.config.text_encoder.hidden = 64;
  o.config.text_encoder.intermediate = 96;
  o.config.text_encoder.num_heads = 4;
  o.config.text_encoder.num_kv_heads = 2;
  o.config.text_encoder.head_dim = 16;
  o.config.text_encoder.vocab_size = 1000;
  o.config.text_encoder.num_layers = 28;
  o.config.vae.block_out_channels = {32, 32, 64, 64};
  uint64_t last_total = 0;
  write_synthetic_model(o, [&](const std::string&, uint64_t done, uint64_t total) {
    EXPECT_LE(done, total);
    last_total = total;
  });
  EXPECT_GT(last_total, 0u);
  auto store = open_model(o.out_dir);
  EXPECT_EQ(store->config().transformer.num_single_blocks, 2);
  EXPECT_EQ(store->config().text_encoder.num_layers, 28);
  EXPECT_TRUE(store->has_unit("text_encoder.layer.27"));
  EXPECT_TRUE(store->has_unit("text_encoder.norm"));
  // Values follow the documented rules: norm weights near 1, finite everywhere.
  auto norm = weight_to_floats(store->acquire("transformer.single.0")->get("attn.norm_q.weight"));
  for (float v : norm) EXPECT_NEAR(v, 1.8f, 0.4f);
}

}  // namespace
}  // namespace klein
