// FLUX.2-dev's denoising loop against the official Flux2Pipeline runs on the tiny model (given
// the prompt embeddings and the noise): the embedded guidance, every step's velocity and
// latents, text-to-image at two sizes and an edit with one reference image
// (tests/data/flux2-dev-tiny, vectors/e2e).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/npy.h"
#include "flux2/official_forward.h"
#include "flux2_dev/dev_tiny.h"
#include "models/flux2/sampler.h"
#include "models/flux2/schedule.h"
#include "ops/compute.h"

namespace klein::testing {
namespace {

constexpr double kTolerance = 1e-4;  // max|diff| / max|ref|

struct RunCase {
  std::string name, context;  // e2e case, text encoder case
  flux2::LatentGrid target;
  std::vector<flux2::LatentGrid> references;
};

class DevSampler : public ::testing::TestWithParam<RunCase> {};

TEST_P(DevSampler, EveryStepMatchesTheOfficialPipeline) {
  const RunCase& c = GetParam();
  ComponentFileStore store(dev_dir() / "model" / "transformer" / "diffusion_pytorch_model.safetensors",
                           "transformer", klein_transformer_unit_of, dev_config());
  Compute cx(2);
  const std::filesystem::path e = dev_vectors() / "e2e" / c.name;
  const nlohmann::json cases = read_json_file(dev_vectors() / "e2e" / "cases.json");
  nlohmann::json info;
  for (const auto& k : cases["cases"])
    if (k["name"] == c.name) info = k;
  ASSERT_FALSE(info.is_null());

  const Tensor context = load_rows(dev_vectors() / "text_encoder" / (c.context + "_context.npy"));
  Tensor noise = flux2::pack_latents([&] {
    Tensor chw = read_npy(e / "noise.npy").to_tensor();
    chw.reshape({chw.numel() / c.target.tokens(), c.target.rows, c.target.cols});
    return chw;
  }());
  Tensor ref_tokens;
  flux2::SamplerInputs in;
  in.context = &context;
  in.noise = &noise;
  in.target = c.target;
  if (!c.references.empty()) {
    ref_tokens = load_rows(e / "ref_tokens.npy");
    in.references.push_back({&ref_tokens, c.references[0]});
  }
  const int64_t steps = info["steps"].get<int64_t>();
  in.schedule = flux2::make_schedule(store.config().scheduler, c.target.tokens(), steps);
  in.guidance = info["guidance"].get<float>();
  int64_t seen = 0;
  in.on_step = [&](const flux2::StepInfo& s) {
    const std::string p = "step" + std::to_string(s.step) + "_";
    const double dv = scaled_diff(s.velocity.data(), read_npy(e / (p + "velocity.npy")).to_f32().data(),
                                  s.velocity.numel());
    std::printf("  %s step %lld: velocity scaled diff %.3g\n", c.name.c_str(),
                static_cast<long long>(s.step), dv);
    EXPECT_TRUE(matches_npy(s.velocity, e / (p + "velocity.npy"), kTolerance)) << p;
    EXPECT_TRUE(matches_npy(s.latents_out, e / (p + "latents_out.npy"), kTolerance)) << p;
    EXPECT_FLOAT_EQ(s.timestep, read_npy(e / (p + "timestep.npy")).to_f32()[0]) << p;
    EXPECT_FLOAT_EQ(in.guidance, read_npy(e / (p + "guidance.npy")).to_f32()[0]) << p;
    ++seen;
  };
  const flux2::SamplerResult r = flux2::sample(store, in, cx);
  EXPECT_EQ(seen, steps);
  EXPECT_TRUE(r.warnings.empty());
  EXPECT_FALSE(flux2::uses_guidance(store.config(), in.guidance));  // one forward per step
}

INSTANTIATE_TEST_SUITE_P(
    Runs, DevSampler,
    ::testing::Values(RunCase{"t2i_h64_w64", "short_left", {4, 4}, {}},
                      RunCase{"t2i_h48_w80", "long_left", {3, 5}, {}},
                      RunCase{"t2i_h64_w48_right", "short_right", {4, 3}, {}},
                      RunCase{"edit_h64_w64", "short_left", {4, 4}, {{4, 5}}}),
    [](const ::testing::TestParamInfo<RunCase>& i) { return i.param.name; });

}  // namespace
}  // namespace klein::testing
