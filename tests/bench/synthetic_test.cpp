#include <gtest/gtest.h>

#include "support/testing.h"
#include "weights/model_source.h"
#include "bench/support/synthetic.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

// A small configuration of the 4B's layout.
SyntheticModelOptions small_model(const std::string& name) {
  SyntheticModelOptions o;
  o.out_dir = testing::temp_dir(name) / "model";
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
  return o;
}

// The synthetic writer and the loader agree on names, shapes, shards and configs: a small
// configuration written by write_synthetic_model opens through the normal discovery path.
TEST(SyntheticModel, SmallConfigurationLoadsLikeARealCheckpoint) {
  const SyntheticModelOptions o = small_model("synth");
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

// The tokenizer directory may hold only tokenizer.json; otherwise the three files of the slow
// layout are needed, and a missing one is named.
TEST(SyntheticModel, TokenizerDirectoryOfEitherLayout) {
  SyntheticModelOptions o = small_model("synth-tokenizer-json");
  o.tokenizer_dir = o.out_dir.parent_path() / "tokenizer";
  fs::create_directories(o.tokenizer_dir);
  fs::create_symlink(fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "tokenizer-json" /
                         "merge-pairs" / "tokenizer.json",
                     o.tokenizer_dir / "tokenizer.json");
  write_synthetic_model(o);
  EXPECT_TRUE(fs::exists(o.out_dir / "tokenizer" / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(o.out_dir / "tokenizer" / "vocab.json"));

  SyntheticModelOptions slow = small_model("synth-tokenizer-partial");
  slow.tokenizer_dir = slow.out_dir.parent_path() / "tokenizer";
  fs::create_directories(slow.tokenizer_dir);
  fs::copy_file(testing::tiny_model() / "tokenizer" / "vocab.json",
                slow.tokenizer_dir / "vocab.json");
  EXPECT_NE(testing::error_of([&] { write_synthetic_model(slow); }).find("no merges.txt"),
            std::string::npos);
}

}  // namespace
}  // namespace klein
