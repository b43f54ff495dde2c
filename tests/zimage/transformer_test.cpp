// The Z-Image transformer against the official ZImageTransformer2DModel forwards of
// ../shared/testdata/zimage-tiny (vectors/transformer: every intermediate of one forward, and a
// CFG batch of two items with different caption lengths, each run alone here). The weights are
// read from the tiny model's diffusers safetensors file through the family's unit layout.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <memory>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "formats/safetensors.h"
#include "models/zimage/checkpoint/config.h"
#include "models/zimage/latents.h"
#include "models/zimage/transformer.h"
#include "models/zimage/checkpoint/units.h"
#include "support/testing.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 1e-4;  // the set's README: transformer group target (scaled)

using testing::zimage_dir;
fs::path transformer_vector(const std::string& name) {
  return zimage_dir() / "vectors" / "transformer" / (name + ".npy");
}

class ZImageTransformer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path model = zimage_dir() / "model" / "transformer";
    config_ = parse_transformer_config(nlohmann::json::parse(read_text_file(model / "config.json")),
                                       "config.json");
    store_ = std::make_unique<testing::ComponentFileStore>(
        model / "diffusion_pytorch_model.safetensors", "transformer", transformer_unit_of);
  }
  static void TearDownTestSuite() { store_.reset(); }

  static inline TransformerConfig config_;
  static inline std::unique_ptr<testing::ComponentFileStore> store_;
};

::testing::AssertionResult close_to(const float* got, int64_t n, const fs::path& ref) {
  const std::vector<float> r = read_npy(ref).to_f32();
  if (int64_t(r.size()) < n)
    return ::testing::AssertionFailure() << ref.filename() << " has " << r.size() << " values, "
                                         << "the engine gave " << n;
  const double s = testing::scaled_diff(got, r.data(), n);
  std::printf("  %-44s scaled diff %.3g\n", ref.filename().string().c_str(), s);
  if (s <= kTolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << ref.filename() << ": scaled diff " << s;
}

// A [C, H, W] latent from the case's stacked input x [B, C, 1, H, W], item `item`.
Tensor latent_of(const std::string& stem, int64_t item) {
  const NpyArray x = read_npy(transformer_vector(stem + "_x"));
  const int64_t C = x.shape[1], H = x.shape[3], W = x.shape[4];
  Tensor t({C, H, W});
  const std::vector<float> all = x.to_f32();
  std::memcpy(t.data(), all.data() + item * C * H * W, size_t(C * H * W) * sizeof(float));
  return t;
}

TEST(ZImageConfig, ReadsTheTinyModelAndRefusesWhatItCannotRun) {
  const auto j =
      nlohmann::json::parse(read_text_file(zimage_dir() / "model" / "transformer" / "config.json"));
  const TransformerConfig c = parse_transformer_config(j, "config.json");
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.head_dim(), 128);
  EXPECT_EQ(c.ffn_hidden(), 682);  // int(256 / 3 * 8)
  EXPECT_EQ(c.adaln_dim(), 256);
  EXPECT_EQ(c.cap_feat_dim, 32);
  EXPECT_EQ(c.axes_lens[0], 1536);
  TransformerConfig real;  // the defaults are Z-Image-Turbo's
  EXPECT_EQ(real.ffn_hidden(), 10240);
  EXPECT_EQ(real.adaln_dim(), 256);

  auto bad = j;
  bad["all_patch_size"] = {4};
  EXPECT_NE(
      testing::error_of([&] { parse_transformer_config(bad, "c.json"); }).find("patch sizes 4"),
      std::string::npos);
  bad = j;
  bad["siglip_feat_dim"] = 1152;
  EXPECT_NE(testing::error_of([&] { parse_transformer_config(bad, "c.json"); }).find("Omni"),
            std::string::npos);
  bad = j;
  bad["axes_dims"] = {32, 32, 32};
  EXPECT_NE(testing::error_of([&] { parse_transformer_config(bad, "c.json"); }).find("axes_dims"),
            std::string::npos);
}

// A float where an integer belongs is refused by name, never converted: 7.7e124 as "dim" was
// undefined behaviour in the conversion to int64 (found by fuzz/fuzz_config under UBSan). The
// same for an integer list of the wrong length and a VAE factor outside float's range.
TEST(ZImageConfig, RefusesNumbersOfTheWrongKind) {
  for (const char* text : {R"({"dim": 7.7e124})", R"({"n_layers": 2.5})",
                           R"({"axes_dims": [32, 48.0, 48]})", R"({"n_heads": 18446744073709551615})"}) {
    const std::string error = testing::error_of(
        [&] { parse_transformer_config(nlohmann::json::parse(text), "transformer/config.json"); });
    EXPECT_NE(error.find("transformer/config.json"), std::string::npos) << text << ": " << error;
    EXPECT_TRUE(error.find("wrong type") != std::string::npos ||
                error.find("too large") != std::string::npos)
        << text << ": " << error;
  }
  EXPECT_NE(testing::error_of([] {
              parse_transformer_config(nlohmann::json::parse(R"({"axes_dims": [64, 64]})"), "c.json");
            }).find("list of 3 integers"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] {
              parse_latent_scale(nlohmann::json::parse(R"({"scaling_factor": 1e300, "shift_factor": 0})"),
                                 "vae/config.json");
            }).find("out of range"),
            std::string::npos);
}

// Every tensor of the checkpoint is expected, with its shape, and has a unit.
TEST_F(ZImageTransformer, CheckpointHoldsExactlyTheExpectedTensors) {
  const ShapeMap expected = expected_transformer(config_);
  SafetensorsFile file(zimage_dir() / "model" / "transformer" /
                       "diffusion_pytorch_model.safetensors");
  EXPECT_EQ(file.entries().size(), expected.size());
  for (const SafetensorsEntry& e : file.entries()) {
    const auto it = expected.find("transformer." + e.name);
    ASSERT_NE(it, expected.end()) << e.name;
    EXPECT_EQ(it->second, e.shape) << e.name;
  }
  EXPECT_EQ(transformer_unit_of("transformer.layers.1.feed_forward.w2.weight")->unit,
            "transformer.layer.1");
  EXPECT_EQ(transformer_unit_of("transformer.x_pad_token")->unit, "transformer.shared");
  EXPECT_FALSE(transformer_unit_of("transformer.layers.x.w"));
  EXPECT_EQ(store_->units().size(), size_t(1 + 2 * 2 + 2));
}

// Position ids and RoPE tables of the first case, then every intermediate and the output.
TEST_F(ZImageTransformer, MatchesEveryIntermediateOfTheOfficialForward) {
  const std::string stem = "fwd_h64_w96";
  const Tensor cap = read_npy(transformer_vector(stem + "_cap_feats0")).to_tensor();
  const Tensor latent = latent_of(stem, 0);
  SequenceLayout layout{latent.dim(1), latent.dim(2), cap.dim(0), config_.patch};
  EXPECT_EQ(layout.image_rows(), 32);
  EXPECT_EQ(layout.caption_rows(), 32);

  const std::vector<int64_t> ids = position_ids(layout);
  const std::vector<int64_t> x_ids = read_npy(transformer_vector(stem + "_x_pos_ids")).to_i64();
  const std::vector<int64_t> cap_ids = read_npy(transformer_vector(stem + "_cap_pos_ids")).to_i64();
  ASSERT_EQ(ids.size(), x_ids.size() + cap_ids.size());
  EXPECT_TRUE(std::equal(x_ids.begin(), x_ids.end(), ids.begin()));
  EXPECT_TRUE(std::equal(cap_ids.begin(), cap_ids.end(), ids.begin() + int64_t(x_ids.size())));

  Compute cx(2);
  Activations act(config_, layout);
  // The official tables hold one value per complex pair; ours one per head-dim index.
  for (const char* part : {"cos", "sin"}) {
    const Tensor& ours = std::string(part) == "cos" ? act.rope.cos() : act.rope.sin();
    const std::vector<float> ref =
        read_npy(transformer_vector(stem + "_unified_rope_" + part)).to_f32();
    ASSERT_EQ(int64_t(ref.size()) * 2, ours.numel());
    std::vector<float> pairs(ref.size());
    for (size_t i = 0; i < pairs.size(); ++i) pairs[i] = ours.data()[2 * i];
    EXPECT_TRUE(close_to(pairs.data(), int64_t(pairs.size()),
                         transformer_vector(stem + "_unified_rope_" + part)));
  }

  Transformer model(*store_, config_);
  int checked = 0;
  const Observer observe = [&](std::string_view name, const float* data, const Shape& shape) {
    const fs::path ref = transformer_vector(stem + "_" + std::string(name));
    ASSERT_TRUE(fs::exists(ref)) << ref;
    const NpyArray r = read_npy(ref);
    if (name != "final_layer") {
      EXPECT_EQ(numel(r.shape), numel(shape)) << name;
    }
    EXPECT_TRUE(close_to(data, numel(shape), ref)) << name;
    ++checked;
  };
  const float t = read_npy(transformer_vector(stem + "_t")).to_f32()[0];
  model.embed_caption(cap, act, cx, observe);
  const Tensor adaln = model.embed_timestep(t, cx);
  const Tensor out = model.forward(latent, adaln, act, cx, observe);
  // cap_embedder, cap_seq_in, 2 context refiners; t_embedder, x_embedder, x_seq_in,
  // 2 noise refiners, unified_in, 2 layers, final_layer.
  EXPECT_EQ(checked, 4 + 9);
  EXPECT_TRUE(close_to(out.data(), out.numel(), transformer_vector(stem + "_out0")));
}

// The CFG batch: two items with different caption lengths and the same latents and t, each
// run alone (the official batch masks only the batch padding).
TEST_F(ZImageTransformer, EachItemOfTheCfgBatchAlone) {
  const std::string stem = "fwd_cfgbatch_h80_w64";
  const std::vector<float> t = read_npy(transformer_vector(stem + "_t")).to_f32();
  Compute cx(2);
  Transformer model(*store_, config_);
  for (int item = 0; item < 2; ++item) {
    SCOPED_TRACE(item);
    const Tensor cap =
        read_npy(transformer_vector(stem + "_cap_feats" + std::to_string(item))).to_tensor();
    const Tensor latent = latent_of(stem, item);
    Activations act(config_, {latent.dim(1), latent.dim(2), cap.dim(0), config_.patch});
    model.embed_caption(cap, act, cx);
    const Tensor out = model.forward(latent, model.embed_timestep(t[size_t(item)], cx), act, cx);
    EXPECT_TRUE(close_to(out.data(), out.numel(),
                         transformer_vector(stem + "_out" + std::to_string(item))));
  }
}

// A second forward on the same activations (the next step) gives the same output as a fresh
// plan: the caption rows are restored, nothing leaks from the first.
// The memory plan's figure for the buffers is what they take, at the tiny model's sizes and
// (by formula) the real model's: Z-Image-Turbo at 1024x1024 with a full caption.
TEST_F(ZImageTransformer, ActivationsPlanIsWhatTheyHold) {
  for (const SequenceLayout l : {SequenceLayout{8, 12, 17, 2}, SequenceLayout{64, 64, 600, 2},
                                 SequenceLayout{2, 2, 1, 2}})
    EXPECT_EQ(Activations::plan_bytes(config_, l), Activations(config_, l).bytes())
        << l.height << "x" << l.width << " caption " << l.caption;
  const TransformerConfig turbo;
  const double mib =
      double(Activations::plan_bytes(turbo, {128, 128, 512, 2})) / double(1 << 20);
  EXPECT_GT(mib, 400);  // 4608 rows x 3840 x 6 alone are 405 MiB
  EXPECT_LT(mib, 600);
}

TEST_F(ZImageTransformer, ActivationsServeEveryStep) {
  const std::string stem = "fwd_h64_w96";
  const Tensor cap = read_npy(transformer_vector(stem + "_cap_feats0")).to_tensor();
  const Tensor latent = latent_of(stem, 0);
  const float t = read_npy(transformer_vector(stem + "_t")).to_f32()[0];
  Compute cx(2);
  Transformer model(*store_, config_);
  const SequenceLayout layout{latent.dim(1), latent.dim(2), cap.dim(0), config_.patch};
  Activations act(config_, layout);
  model.embed_caption(cap, act, cx);
  (void)model.forward(latent, model.embed_timestep(0.25f, cx), act, cx);
  const Tensor second = model.forward(latent, model.embed_timestep(t, cx), act, cx);
  EXPECT_TRUE(close_to(second.data(), second.numel(), transformer_vector(stem + "_out0")));
}

// forward_work against the weights: every matrix of the tiny transformer times the rows the
// forward runs it on (the caption embedder is once per prompt: not counted).
TEST_F(ZImageTransformer, ForwardWorkCountsEveryMatrixOnItsRows) {
  const SequenceLayout layout{6, 4, 5, config_.patch};  // 3 x 2 patches, a 5-token caption
  const double image = double(layout.image_rows()), caption = double(layout.caption_rows());
  double linear = 0;
  for (const std::string& unit : store_->units()) {
    auto u = store_->acquire(unit);
    for (const Weight& w : u->weights()) {
      if (w.shape.size() != 2 || w.shape[0] == 1) continue;  // norms, pad tokens
      const std::string& n = w.name;
      if (n.find("cap_embedder") != std::string::npos) continue;
      double rows = 1;  // the timestep embedding, the modulations
      const bool modulation = n.find("adaLN") != std::string::npos ||
                              n.find("t_embedder") != std::string::npos;
      if (!modulation) {
        if (n.find("noise_refiner") != std::string::npos || n.find("x_embedder") != std::string::npos ||
            n.find("final_layer") != std::string::npos)
          rows = image;
        else if (n.find("context_refiner") != std::string::npos)
          rows = caption;
        else
          rows = image + caption;  // the main layers
      }
      linear += double(w.shape[0]) * double(w.shape[1]) * rows;
    }
  }
  const ops::ForwardWork w = forward_work(config_, layout);
  EXPECT_DOUBLE_EQ(w.linear_macs, linear);
  const double D = double(config_.dim), n = double(config_.n_refiner_layers);
  EXPECT_DOUBLE_EQ(w.attention_macs, 2 * D * (n * image * image + n * caption * caption +
                                              double(config_.n_layers) * (image + caption) *
                                                  (image + caption)));
}

}  // namespace
}  // namespace klein::zimage
