// FLUX.2-dev's transformer (klein's, plus the guidance embedder) against one forward of the
// official Flux2Transformer2DModel with guidance 4.0 on the tiny model, every block's output
// included (tests/data/flux2-dev-tiny, vectors/transformer).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "flux2/official_forward.h"
#include "flux2_dev/dev_tiny.h"
#include "models/flux2/positions.h"
#include "models/flux2/transformer.h"
#include "ops/compute.h"
#include "support/isa.h"

namespace klein::testing {
namespace {

constexpr double kTransformerTolerance = 1e-4;  // max|diff| / max|ref|

ComponentFileStore transformer_store() {
  return ComponentFileStore(dev_dir() / "model" / "transformer" /
                                "diffusion_pytorch_model.safetensors",
                            "transformer", klein_transformer_unit_of, dev_config());
}

class DevTransformerIsa : public ::testing::TestWithParam<quant::Isa> {};

TEST_P(DevTransformerIsa, ForwardWithGuidanceMatchesTheOfficialModel) {
  const quant::Isa isa = GetParam();
  KLEIN_REQUIRE_ISA(isa);
  ComponentFileStore store = transformer_store();
  ASSERT_TRUE(store.config().transformer.guidance_embeds);
  Compute cx(2, isa);
  flux2::Transformer model(store);
  const std::filesystem::path v = dev_vectors() / "transformer";
  const nlohmann::json inputs = read_json_file(v / "inputs.json");
  const float timestep = inputs["timestep"].get<float>(), guidance = inputs["guidance"].get<float>();

  // 64x48 pixels: a 4 x 3 latent grid behind the 512 text rows.
  const flux2::TokenLayout layout{512, {4, 3}, {}};
  const Tensor context = load_rows(v / "encoder_hidden_states.npy");
  const Tensor hidden = load_rows(v / "hidden_states.npy");
  const flux2::RopeTable rope(flux2::joint_position_ids(layout), model.config().rope_axes,
                              model.config().rope_theta);
  const Tensor text = model.embed_text(context, cx);
  flux2::Activations act(model.config(), layout);
  flux2::Modulation mod(model.config());
  model.modulate(timestep, mod, cx, guidance);
  EXPECT_TRUE(matches_npy(mod.temb.data(), mod.temb.numel(), v / "time_guidance_embed.npy",
                          kTransformerTolerance));
  std::vector<float> velocity(size_t(layout.target_tokens() * model.config().out_channels));
  int observed = 0;
  model.forward(hidden.data(), text, nullptr, mod, rope, act, velocity.data(), cx,
                [&](std::string_view name, const float* data, const Shape& shape) {
                  std::string file(name);
                  for (char& ch : file) if (ch == '.') ch = '_';
                  const std::filesystem::path ref = v / (file + ".npy");
                  if (!std::filesystem::exists(ref)) return;
                  ++observed;
                  std::printf("  %-40s scaled diff %.3g\n", ref.filename().string().c_str(),
                              scaled_diff(data, read_npy(ref).to_f32().data(), numel(shape)));
                  EXPECT_TRUE(matches_npy(data, numel(shape), ref, kTransformerTolerance)) << name;
                });
  EXPECT_GE(observed, 6);  // 2 x 2 double-block streams, 2 single blocks, norm_out
  EXPECT_TRUE(
      matches_npy(velocity.data(), int64_t(velocity.size()), v / "out.npy", kTransformerTolerance));
}

INSTANTIATE_TEST_SUITE_P(Isas, DevTransformerIsa, ::testing::ValuesIn(compiled_isas()),
                         [](const ::testing::TestParamInfo<quant::Isa>& info) {
                           return std::string(quant::isa_name(info.param));
                         });

TEST(DevTransformer, RefusesToRunWithoutAGuidanceValue) {
  ComponentFileStore store = transformer_store();
  Compute cx(1);
  flux2::Transformer model(store);
  flux2::Modulation mod(model.config());
  EXPECT_NE(error_of([&] { model.modulate(0.5f, mod, cx); }).find("guidance"), std::string::npos);
}

TEST(DevTransformer, GuidanceChangesTheEmbedding) {
  ComponentFileStore store = transformer_store();
  Compute cx(1);
  flux2::Transformer model(store);
  flux2::Modulation a(model.config()), b(model.config());
  model.modulate(0.5f, a, cx, 1.0f);
  model.modulate(0.5f, b, cx, 4.0f);
  EXPECT_GT(scaled_diff(a.temb.data(), b.temb.data(), a.temb.numel()), 1e-3);
}

}  // namespace
}  // namespace klein::testing
