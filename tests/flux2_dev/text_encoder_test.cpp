// FLUX.2-dev's text encoder (the Mistral language model of Mistral3ForConditionalGeneration)
// against the official pipeline's prompt embeddings on the tiny model, for left and right
// padding (tests/data/flux2-dev-tiny, vectors/text_encoder).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/npy.h"
#include "flux2_dev/dev_tiny.h"
#include "models/qwen3/text_encoder.h"
#include "ops/compute.h"
#include "support/isa.h"

namespace klein::testing {
namespace {

constexpr double kEncoderTolerance = 1e-4;  // max|diff| / max|ref|

class DevTextEncoder
    : public ::testing::TestWithParam<std::tuple<std::string, quant::Isa>> {};

TEST_P(DevTextEncoder, MatchesTheOfficialContextAndLayers) {
  const std::string name = std::get<0>(GetParam());
  const quant::Isa isa = std::get<1>(GetParam());
  KLEIN_REQUIRE_ISA(isa);
  ModelConfig config = dev_config();
  EXPECT_FALSE(config.text_encoder.qk_norm);
  EXPECT_EQ(config.text_encoder.head_dim, 16);  // set apart from hidden / heads = 12
  ComponentFileStore store(dev_dir() / "model" / "text_encoder" / "model.safetensors.index.json",
                           "text_encoder", dev_text_unit_of, config);
  Compute cx(2, isa);
  qwen3::TextEncoder encoder(store, cx);

  const std::filesystem::path v = dev_vectors() / "text_encoder";
  std::vector<int32_t> ids, mask;
  for (int64_t x : read_npy(v / (name + "_input_ids.npy")).to_i64()) ids.push_back(int32_t(x));
  for (int64_t x : read_npy(v / (name + "_attention_mask.npy")).to_i64()) mask.push_back(int32_t(x));
  ASSERT_EQ(ids.size(), 512u);

  std::vector<std::pair<int64_t, std::vector<float>>> layers;
  const Tensor context = encoder.encode(ids, mask, [&](int64_t layer, const Tensor& hidden) {
    if (layer == 10 || layer == 20 || layer == 30)
      layers.emplace_back(layer, std::vector<float>(hidden.data(), hidden.data() + hidden.numel()));
  });
  ASSERT_EQ(layers.size(), 3u);
  for (const auto& [layer, hidden] : layers) {
    char file[32];
    std::snprintf(file, sizeof file, "_hidden_%02d.npy", int(layer));
    const std::filesystem::path ref = v / (name + file);
    const int64_t n = int64_t(hidden.size());
    std::printf("  %-32s scaled diff %.3g\n", ref.filename().string().c_str(),
                scaled_diff(hidden.data(), read_npy(ref).to_f32().data(), n));
    EXPECT_TRUE(matches_npy(hidden.data(), n, ref, kEncoderTolerance)) << "layer " << layer;
  }
  EXPECT_TRUE(matches_npy(context, v / (name + "_context.npy"), kEncoderTolerance));
}

// The four padding cases on this CPU's best path, and one of them on every compiled path
// (the layers are the same code whatever the padding; the sanitizer suite runs each case once
// per ISA otherwise, 30-odd test-seconds for nothing new).
std::vector<std::tuple<std::string, quant::Isa>> dev_text_cases() {
  std::vector<std::tuple<std::string, quant::Isa>> cases;
  for (const char* name : {"short_left", "short_right", "long_left", "long_right"})
    cases.emplace_back(name, quant::best_isa());
  for (quant::Isa isa : compiled_isas())
    if (isa != quant::best_isa()) cases.emplace_back("long_left", isa);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DevTextEncoder, ::testing::ValuesIn(dev_text_cases()),
    [](const ::testing::TestParamInfo<std::tuple<std::string, quant::Isa>>& info) {
      return std::get<0>(info.param) + "_" + std::string(quant::isa_name(std::get<1>(info.param)));
    });

}  // namespace
}  // namespace klein::testing
