// The Z-Image ControlNet (models/zimage/controlnet.h) against diffusers' ZImageControlNetModel
// and ZImageControlNetPipeline on ../shared/testdata/zimage-control: from the stored prompt
// features, control context and initial noise, the hints of step 0 for the layers they are
// added after, every step's model output and latents, and the final latents, for the plain
// ControlNet (no guidance, and CFG with the control input repeated for the negative prompt)
// and the inpainting mode's 33-channel context. Both forms of the tiny control model (the
// diffusers directory and the original single file) hold the same tensors. The config reader
// refuses the versions and shapes it does not run, by name.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "models/zimage/checkpoint/controlnet.h"
#include "models/zimage/checkpoint/units.h"
#include "models/zimage/controlnet.h"
#include "models/zimage/sampler.h"
#include "models/zimage/transformer.h"
#include "support/testing.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace controlnet_test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path set_dir() { return testing::tiny_dir().parent_path() / "zimage-control"; }
json read_json(const fs::path& p) { return json::parse(read_text_file(p)); }

// The [S, D] rows of item 0 of a stored [B, S, D] array.
std::vector<float> first_item(const fs::path& file, int64_t values) {
  std::vector<float> all = read_npy(file).to_f32();
  all.resize(size_t(values));
  return all;
}

struct Case {
  const char* name;
  double tolerance;
};

class ZImageControlNet : public ::testing::TestWithParam<Case> {};

TEST_P(ZImageControlNet, MatchesTheOfficialRun) {
  const Case& c = GetParam();
  const fs::path dir = set_dir() / "vectors" / "e2e" / c.name;
  const json info = read_json(dir / "case.json");
  Compute cx(2);

  const TransformerConfig tc =
      parse_transformer_config(read_json(set_dir() / "model" / "transformer" / "config.json"), "t");
  testing::ComponentFileStore transformer_store(
      set_dir() / "model" / "transformer" / "diffusion_pytorch_model.safetensors", "transformer",
      transformer_unit_of);
  const ControlNetConfig cc =
      parse_controlnet_config(read_json(set_dir() / "controlnet" / "config.json"), "cn", tc);
  testing::ComponentFileStore control_store(
      set_dir() / "controlnet" / "diffusion_pytorch_model.safetensors", "controlnet",
      controlnet_unit_of);
  Transformer model(transformer_store, tc);
  ControlNet control(control_store, cc, model);

  const Tensor prompt = read_npy(dir / "prompt_embeds.npy").to_tensor();
  const float guidance = info["guidance_scale"].get<float>();
  const float scale = info["controlnet_conditioning_scale"].get<float>();
  Tensor x = read_npy(dir / "noise.npy").to_tensor();
  const int64_t H = x.dim(2), W = x.dim(3);
  x.reshape({x.dim(1), H, W});
  // The control context [B, Cin, 1, h, w]: item 0 (with CFG the same input twice).
  const NpyArray context_file = read_npy(dir / "control_context.npy");
  ASSERT_EQ(context_file.shape[1], cc.in_channels);
  std::vector<float> context_values = context_file.to_f32();
  context_values.resize(size_t(cc.in_channels * H * W));
  Tensor context({cc.in_channels, H, W});
  std::copy(context_values.begin(), context_values.end(), context.data());

  struct Sequence {
    std::unique_ptr<Activations> act;
    std::unique_ptr<ControlActivations> control;
  };
  auto sequence = [&](const Tensor& caption) {
    Sequence s;
    s.act = std::make_unique<Activations>(tc, SequenceLayout{H, W, caption.dim(0), tc.patch});
    s.control = std::make_unique<ControlActivations>(tc, s.act->layout);
    model.embed_caption(caption, *s.act, cx);
    control.embed_control(context, *s.control, *s.act, cx);
    return s;
  };
  Sequence pos = sequence(prompt);
  Sequence neg;
  if (guidance > 0) neg = sequence(read_npy(dir / "negative_prompt_embeds.npy").to_tensor());

  const SchedulerConfig sched = parse_scheduler_config(
      read_json(set_dir() / "model" / "scheduler" / "scheduler_config.json"), "scheduler");
  const Schedule s = make_schedule(sched, info["steps"].get<int64_t>());
  Guidance g;
  g.scale = guidance;
  Tensor v(x.shape());
  int hints_seen = 0;
  for (int64_t i = 0; i < s.steps(); ++i) {
    const std::string p = "step" + std::to_string(i) + "_";
    const Tensor adaln = model.embed_timestep(s.model_time(i), cx);
    auto run = [&](Sequence& q, bool check_hints) {
      Observer observe;
      if (check_hints)
        observe = [&](std::string_view name, const float* data, const Shape& shape) {
          if (!name.starts_with("controlnet_hint_")) return;
          const std::string layer(name.substr(std::string_view("controlnet_hint_").size()));
          const int64_t n = shape[0] * shape[1];
          const std::vector<float> want =
              first_item(dir / ("step0_controlnet_hint_layer" + layer + ".npy"), n);
          EXPECT_LE(testing::scaled_diff(data, want.data(), n), c.tolerance) << name;
          ++hints_seen;
        };
      control.start_forward(x, adaln, scale, *q.control, *q.act, cx);
      return model.forward(x, adaln, *q.act, cx, {}, [&](int64_t layer, float* stream) {
        control.add_hints(layer, stream, *q.control, *q.act, cx, observe);
      });
    };
    const Tensor out = run(pos, i == 0);
    EXPECT_TRUE(testing::matches_npy(out, dir / (p + "model_out.npy"), c.tolerance)) << p;
    const bool guided = guided_at(g, s, i);
    Tensor neg_out;
    if (guided) neg_out = run(neg, false);
    velocity(out.data(), guided ? neg_out.data() : nullptr, out.numel(), g, v.data());
    euler_step(x.data(), v.data(), x.numel(), s.sigmas[size_t(i)], s.sigmas[size_t(i + 1)]);
    EXPECT_TRUE(testing::matches_npy(x, dir / (p + "latents_out.npy"), c.tolerance)) << p;
  }
  EXPECT_EQ(hints_seen, int(cc.layer_places.size()));
  EXPECT_TRUE(testing::matches_npy(x, dir / "final_latents.npy", c.tolerance));
}

INSTANTIATE_TEST_SUITE_P(OfficialRuns, ZImageControlNet,
                         ::testing::Values(Case{"controlnet_c075_h64_w96", 1e-4},
                                           Case{"controlnet_c100_cfg_h96_w64", 1e-4},
                                           Case{"controlnet_inpaint_h80_w64", 1e-4}),
                         [](const auto& info) { return std::string(info.param.name); });

// The original single file holds the diffusers directory's tensors under the same names.
TEST(ZImageControlNetFiles, TheSingleFileHoldsTheSameTensors) {
  const ControlNetConfig cc = parse_controlnet_config(
      read_json(set_dir() / "controlnet" / "config.json"), "cn",
      parse_transformer_config(read_json(set_dir() / "model" / "transformer" / "config.json"), "t"));
  testing::ComponentFileStore diffusers(
      set_dir() / "controlnet" / "diffusion_pytorch_model.safetensors", "controlnet",
      controlnet_unit_of);
  testing::ComponentFileStore single(
      set_dir() / "controlnet_original" / "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors",
      "controlnet", controlnet_unit_of);
  EXPECT_EQ(diffusers.units(), single.units());
  EXPECT_EQ(diffusers.units().size(), 1 + cc.refiner_places.size() + cc.layer_places.size());
}

TEST(ZImageControlNetFiles, RefusesWhatItDoesNotRun) {
  const TransformerConfig tc =
      parse_transformer_config(read_json(set_dir() / "model" / "transformer" / "config.json"), "t");
  const json good = read_json(set_dir() / "controlnet" / "config.json");
  auto error = [&](const std::function<void(json&)>& change) {
    json j = good;
    change(j);
    return testing::error_of([&] { parse_controlnet_config(j, "cn/config.json", tc); });
  };
  EXPECT_NE(error([](json& j) { j["add_control_noise_refiner"] = nullptr; }).find("Union 1.0"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["add_control_noise_refiner"] = "control_layers"; })
                .find("Union 2.0"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["dim"] = 3840; }).find("another model"), std::string::npos);
  EXPECT_NE(error([](json& j) { j["control_layers_places"] = {0, 3}; }).find("main layer 3"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["control_layers_places"] = {2, 0}; }).find("increasing"),
            std::string::npos);
  EXPECT_NE(error([](json& j) { j["control_in_dim"] = 4; }).find("control_in_dim"),
            std::string::npos);
}

}  // namespace
}  // namespace controlnet_test
}  // namespace klein::zimage
