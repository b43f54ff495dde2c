#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "bench/support/synthetic.h"
#include "convert/convert.h"
#include "support/testing.h"
#include "weights/expected.h"
#include "weights/family.h"
#include "weights/model_source.h"

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
  fs::create_symlink(testing::tokenizer_json_fixture("merge-pairs"),
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

// The published variants' configurations: the transformer's parameter count is the size in
// the name (klein-4B: 3.9 B with its embedders, klein-9B: 9.1 B), the text encoder is the
// Qwen3 whose hidden size makes the context (3 x hidden), and the names set the pipeline.
TEST(SyntheticModel, VariantConfigurations) {
  auto billions = [](const ShapeMap& shapes) {
    double n = 0;
    for (const auto& [_, shape] : shapes) n += double(numel(shape));
    return n / 1e9;
  };
  const ModelConfig small = klein_variant_config("4b");
  const ModelConfig large = klein_variant_config("9b-kv");
  EXPECT_NEAR(billions(expected_transformer(small.transformer)), 3.9, 0.1);
  EXPECT_NEAR(billions(expected_transformer(large.transformer)), 9.1, 0.1);
  EXPECT_EQ(small.transformer.context_dim, small.text_encoder.context_dim());
  EXPECT_EQ(large.transformer.context_dim, large.text_encoder.context_dim());
  EXPECT_EQ(large.transformer.inner_dim(), 4096);
  EXPECT_TRUE(large.reference_cache);
  EXPECT_TRUE(large.is_distilled);
  EXPECT_FALSE(klein_variant_config("9b-base").is_distilled);
  EXPECT_FALSE(klein_variant_config("9b-base").reference_cache);
  EXPECT_NE(testing::error_of([] { klein_variant_config("12b"); }).find("expected 4b"),
            std::string::npos);
  // ... and each is recognised as itself (what inspect prints and the container stores).
  for (const char* v : {"4b", "4b-base", "4b-kv", "9b", "9b-base", "9b-kv"})
    EXPECT_EQ(variant_name(klein_variant_config(v)), v);
  ModelConfig other = small;
  other.transformer.num_heads = 2;
  EXPECT_EQ(variant_name(other), "");
}

// Z-Image-Turbo: a 6.15 B transformer (the published checkpoint's size) over Qwen3-4B read at
// its last layer but one, and the FLUX.1 VAE without latent statistics. A small configuration
// of its layout is written with the files a ZImagePipeline directory has, and opens as
// Z-Image through the normal discovery path.
TEST(SyntheticModel, ZImageTurbo) {
  const ModelConfig turbo = klein_variant_config("zimage-turbo");
  EXPECT_EQ(turbo.family, "z-image");
  double n = 0;
  for (const auto& [_, shape] : expected_tensors(turbo, Component::Transformer))
    n += double(numel(shape));
  EXPECT_NEAR(n / 1e9, 6.15, 0.05);
  EXPECT_EQ(turbo.text_encoder.output_layers, std::vector<int64_t>{35});
  EXPECT_FALSE(turbo.vae.latent_batch_norm);

  SyntheticModelOptions o = small_model("synth-zimage");
  o.config = turbo;
  o.config.family_transformer = {{"dim", 256},       {"n_heads", 2},          {"n_layers", 2},
                                 {"n_refiner_layers", 1}, {"cap_feat_dim", 64}};
  o.config.text_encoder = small_model("unused").config.text_encoder;
  o.config.text_encoder.output_layers = {27};
  o.config.vae.block_out_channels = {32, 32, 64, 64};
  write_synthetic_model(o);
  auto store = open_model(o.out_dir);
  EXPECT_EQ(store->config().family, "z-image");
  EXPECT_EQ(store->config().text_encoder.output_layers, std::vector<int64_t>{27});
  EXPECT_TRUE(store->has_unit("transformer.layer.1"));
  EXPECT_TRUE(store->has_unit("transformer.context_refiner.0"));
  EXPECT_FALSE(store->has_unit("vae.latent_stats"));
  EXPECT_FLOAT_EQ(float(store->config().vae.scaling_factor), 0.3611f);
}

// FLUX.2-dev: a 32 B transformer (8 double + 48 single blocks of width 6144, a guidance
// embedder) over Mistral-Small-3.1's language model read at layers 10, 20 and 30.
TEST(SyntheticModel, Flux2DevConfiguration) {
  const ModelConfig dev = klein_variant_config("dev");
  EXPECT_EQ(dev.family, "flux2-dev");
  double n = 0;
  for (const auto& [_, shape] : expected_tensors(dev, Component::Transformer))
    n += double(numel(shape));
  EXPECT_NEAR(n / 1e9, 32.2, 0.3);
  EXPECT_TRUE(dev.transformer.guidance_embeds);
  EXPECT_EQ(dev.transformer.context_dim, dev.text_encoder.context_dim());
  EXPECT_EQ(dev.text_encoder.output_layers, (std::vector<int64_t>{10, 20, 30}));
  EXPECT_FALSE(dev.text_encoder.qk_norm);
  EXPECT_EQ(variant_name(dev), "dev");
  // Its files are not written (Qwen3's layout only, and about 100 GB): refused before any.
  SyntheticModelOptions o = small_model("synth-dev-files");
  o.config = dev;
  EXPECT_NE(testing::error_of([&] { write_synthetic_model(o); }).find("give -t q4"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(o.out_dir));
}

// SyntheticStore: the same values on any number of threads, and `convert_model` writes it into
// a container that opens like a converted checkpoint, its tensors the store's bytes (bf16).
TEST(SyntheticModel, StoreConvertsStraightIntoAContainer) {
  ModelConfig c = klein_variant_config("dev");
  c.transformer = small_model("unused").config.transformer;
  c.transformer.guidance_embeds = true;
  c.text_encoder = small_model("unused").config.text_encoder;
  c.text_encoder.qk_norm = false;
  c.text_encoder.num_layers = 40;
  c.text_encoder.output_layers = {10, 20, 30};
  c.vae.block_out_channels = {32, 32, 64, 64};
  SyntheticStore one(c, 7, 1), three(c, 7, 3);
  const UnitRef a = one.acquire("transformer.double.0"), b = three.acquire("transformer.double.0");
  ASSERT_EQ(a->weights().size(), b->weights().size());
  for (size_t i = 0; i < a->weights().size(); ++i) {
    const Weight& x = a->weights()[i];
    ASSERT_EQ(x.nbytes, b->weights()[i].nbytes) << x.name;
    EXPECT_EQ(std::memcmp(x.data, b->weights()[i].data, x.nbytes), 0) << x.name;
  }
  EXPECT_FALSE(one.has_unit("text_encoder.layer.30"));  // nothing past the last output layer
  EXPECT_TRUE(one.has_unit("text_encoder.layer.29"));

  convert::ConvertOptions o;
  o.output = testing::temp_dir("synth-store") / "dev.klein";
  o.target = DType::BF16;
  o.source.tokenizer =
      fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model" / "tokenizer";
  o.store = &three;
  o.threads = 2;
  convert::convert_model(o);
  auto container = open_model(o.output);
  EXPECT_EQ(container->config().family, "flux2-dev");
  std::vector<std::string> stored_units = container->units(), made = three.units();
  std::sort(stored_units.begin(), stored_units.end());
  std::sort(made.begin(), made.end());
  EXPECT_EQ(stored_units, made);
  const UnitRef stored = container->acquire("transformer.double.0");
  for (const Weight& x : b->weights()) {
    const Weight* y = stored->find(x.name.substr(b->prefix().size()));
    ASSERT_NE(y, nullptr) << x.name;
    EXPECT_EQ(y->dtype, DType::BF16) << x.name;
    ASSERT_EQ(y->nbytes, x.nbytes) << x.name;
    EXPECT_EQ(std::memcmp(x.data, y->data, x.nbytes), 0) << x.name;
  }
}

}  // namespace
}  // namespace klein
