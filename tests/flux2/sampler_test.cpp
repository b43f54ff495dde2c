// The 4-step denoising loop against full pipeline runs (vectors/e2e), and guidance plumbing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "flux2/official_forward.h"
#include "models/flux2/sampler.h"
#include "support/config_override.h"
#include "support/testing.h"
#include "support/tiny_model_suite.h"
#include "weights/model_source.h"

namespace klein::flux2 {
namespace {

constexpr double kSamplerTolerance = 1e-4;

std::filesystem::path e2e(const std::string& case_name, const std::string& file) {
  return testing::tiny_vectors() / "e2e" / case_name / (file + ".npy");
}

::testing::AssertionResult close_to(const Tensor& got, const std::filesystem::path& ref) {
  const std::vector<float> r = read_npy(ref).to_f32();
  if (int64_t(r.size()) == got.numel())
    std::printf("  %-40s scaled diff %.3g\n",
                (ref.parent_path().filename() / ref.filename()).string().c_str(),
                testing::scaled_diff(got.data(), r.data(), got.numel()));
  return testing::matches_npy(got, ref, kSamplerTolerance);
}

using testing::load_rows;  // [1, rows, width] .npy → [rows, width]

// [1, C, h, w] .npy → [C, h, w]
Tensor load_chw(const std::filesystem::path& path) {
  NpyArray a = read_npy(path);
  Tensor t = a.to_tensor();
  t.reshape({a.shape[1], a.shape[2], a.shape[3]});
  return t;
}

using testing::ConfigOverride;

class SamplerTest : public testing::TinyModelSuite {
 protected:
  // Runs the case's loop and checks every recorded step and the result.
  static void run_case(const std::string& name, LatentGrid target,
                       const std::vector<LatentGrid>& ref_grids) {
    Compute cx(2);
    const Tensor context = load_rows(e2e(name, "prompt_embeds"));
    const Tensor noise = pack_latents(load_chw(e2e(name, "noise")));
    Tensor ref_tokens;
    SamplerInputs in;
    in.context = &context;
    in.noise = &noise;
    in.target = target;
    if (!ref_grids.empty()) {
      ref_tokens = load_rows(e2e(name, "ref_tokens"));
      ASSERT_EQ(ref_grids.size(), 1u);
      in.references.push_back({&ref_tokens, ref_grids[0]});
    }
    in.schedule = make_schedule(store_->config().scheduler, target.tokens(), 4);
    int64_t steps_seen = 0;
    in.on_step = [&](const StepInfo& s) {
      const std::string step = "step" + std::to_string(s.step);
      EXPECT_EQ(s.timestep, read_npy(e2e(name, step + "_timestep")).to_f32()[0]) << step;
      EXPECT_TRUE(close_to(s.latents_in, e2e(name, step + "_latents_in")));
      EXPECT_TRUE(close_to(s.velocity, e2e(name, step + "_velocity")));
      EXPECT_TRUE(close_to(s.latents_out, e2e(name, step + "_latents_out")));
      ++steps_seen;
    };
    const SamplerResult r = sample(*store_, in, cx);
    EXPECT_EQ(steps_seen, 4);
    EXPECT_TRUE(r.warnings.empty());
    EXPECT_GT(r.activation_bytes, 0u);
    EXPECT_TRUE(close_to(r.latents, e2e(name, "final_latents")));
  }

};


TEST(PackLatents, RoundTripsAndPacksRowMajor) {
  Tensor chw({3, 2, 2});
  for (int64_t i = 0; i < chw.numel(); ++i) chw.data()[i] = float(i);
  const Tensor tokens = pack_latents(chw);
  ASSERT_EQ(tokens.shape(), (Shape{4, 3}));
  // token (r=0, c=1), channel 2 = chw[2][0][1]
  EXPECT_EQ(tokens.data()[1 * 3 + 2], chw.data()[2 * 4 + 1]);
  const Tensor back = unpack_latents(tokens, {2, 2});
  for (int64_t i = 0; i < chw.numel(); ++i) EXPECT_EQ(back.data()[i], chw.data()[i]);
}

TEST_F(SamplerTest, TextToImage64x64FourSteps) { run_case("t2i_h64_w64", {4, 4}, {}); }

TEST_F(SamplerTest, TextToImage96x128FourSteps) { run_case("t2i_h96_w128", {6, 8}, {}); }

TEST_F(SamplerTest, EditWithOneReference64x64FourSteps) {
  run_case("edit_h64_w64_ref0", {4, 4}, {{4, 5}});
}

TEST_F(SamplerTest, DistilledModelIgnoresGuidanceWithAWarning) {
  Compute cx(2);
  const Tensor context = load_rows(e2e("t2i_h64_w64", "prompt_embeds"));
  const Tensor noise = pack_latents(load_chw(e2e("t2i_h64_w64", "noise")));
  SamplerInputs in;
  in.context = &context;
  in.noise = &noise;
  in.target = {4, 4};
  in.schedule = make_schedule(store_->config().scheduler, 16, 1);
  in.guidance = 4.0f;  // no negative context: would fail if guidance were applied
  const SamplerResult r = sample(*store_, in, cx);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("guidance"), std::string::npos);
}

TEST_F(SamplerTest, BaseModelAppliesClassifierFreeGuidance) {
  ModelConfig base = store_->config();
  base.is_distilled = false;
  ConfigOverride store(*store_, base);
  Compute cx(2);
  const Tensor context = load_rows(e2e("t2i_h64_w64", "prompt_embeds"));
  const Tensor negative = load_rows(e2e("t2i_h96_w128", "prompt_embeds"));  // any other prompt
  const Tensor noise = pack_latents(load_chw(e2e("t2i_h64_w64", "noise")));
  const float g = 4.0f;

  SamplerInputs in;
  in.context = &context;
  in.negative_context = &negative;
  in.noise = &noise;
  in.target = {4, 4};
  in.schedule = make_schedule(base.scheduler, 16, 2);
  in.guidance = g;
  std::vector<float> guided;
  in.on_step = [&](const StepInfo& s) {
    if (s.step == 0) guided.assign(s.velocity.data(), s.velocity.data() + s.velocity.numel());
  };
  const SamplerResult r = sample(store, in, cx);
  EXPECT_TRUE(r.warnings.empty());

  // The same first step by hand: two forwards and v_u + g (v_c - v_u).
  Transformer model(store);
  const TokenLayout layout{512, {4, 4}, {}};
  const RopeTable rope(joint_position_ids(layout), model.config().rope_axes,
                       model.config().rope_theta);
  Activations act(model.config(), layout);
  Modulation mod(model.config());
  model.modulate(in.schedule.model_timestep(0), mod, cx);
  std::vector<float> v_c(16 * 128), v_u(16 * 128);
  const Tensor text_c = model.embed_text(context, cx), text_u = model.embed_text(negative, cx);
  model.forward(noise.data(), text_c, nullptr, mod, rope, act, v_c.data(), cx);
  model.forward(noise.data(), text_u, nullptr, mod, rope, act, v_u.data(), cx);
  ASSERT_EQ(guided.size(), v_c.size());
  double max_gap = 0;
  for (size_t i = 0; i < v_c.size(); ++i) {
    EXPECT_EQ(guided[i], v_u[i] + g * (v_c[i] - v_u[i])) << i;
    max_gap = std::max(max_gap, double(std::fabs(v_c[i] - v_u[i])));
  }
  EXPECT_GT(max_gap, 1e-3);  // the two prompts really differ

  in.negative_context = nullptr;
  EXPECT_THROW(sample(store, in, cx), Error);
}

TEST_F(SamplerTest, RejectsNoiseOfTheWrongSize) {
  Compute cx(1);
  const Tensor context = load_rows(e2e("t2i_h64_w64", "prompt_embeds"));
  const Tensor noise = Tensor::zeros({15, 128});
  SamplerInputs in;
  in.context = &context;
  in.noise = &noise;
  in.target = {4, 4};
  in.schedule = make_schedule(store_->config().scheduler, 16, 4);
  try {
    sample(*store_, in, cx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("noise"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace klein::flux2
