// The sigma schedule against the official scheduler's values (vectors/schedule).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/npy.h"
#include "models/flux2/schedule.h"
#include "support/testing.h"

namespace klein::flux2 {
namespace {

// True when a and b are equal or neighbouring float32 values.
bool within_one_ulp(float a, float b) {
  if (a == b) return true;
  const float inf = std::numeric_limits<float>::infinity();
  return std::nextafter(a, inf) == b || std::nextafter(a, -inf) == b;
}

nlohmann::json schedules_json() {
  std::ifstream in(testing::tiny_vectors() / "schedule" / "schedules.json");
  return nlohmann::json::parse(in);
}

TEST(Schedule, MatchesEveryOfficialSchedule) {
  const nlohmann::json all = schedules_json();
  SchedulerConfig config;  // the klein settings: dynamic, exponential, 1000 train steps
  ASSERT_FALSE(all["cases"].empty());
  for (const auto& c : all["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const int64_t tokens = (c["height"].get<int64_t>() / 16) * (c["width"].get<int64_t>() / 16);
    ASSERT_EQ(tokens, c["image_seq_len"].get<int64_t>());
    const int64_t steps = c["num_inference_steps"];
    const Schedule s = make_schedule(config, tokens, steps);
    EXPECT_TRUE(s.warnings.empty());
    EXPECT_NEAR(s.mu, c["mu"].get<double>(), 1e-6);

    const auto dir = testing::tiny_vectors() / "schedule";
    const std::vector<float> sigmas = read_npy(dir / (name + "_sigmas.npy")).to_f32();
    const std::vector<float> timesteps = read_npy(dir / (name + "_timesteps.npy")).to_f32();
    ASSERT_EQ(s.sigmas.size(), sigmas.size());
    ASSERT_EQ(s.timesteps.size(), timesteps.size());
    ASSERT_EQ(s.steps(), steps);
    EXPECT_EQ(s.sigmas.back(), 0.0f);
    for (size_t i = 0; i < sigmas.size(); ++i)
      EXPECT_TRUE(within_one_ulp(s.sigmas[i], sigmas[i]))
          << "sigma " << i << ": " << s.sigmas[i] << " vs " << sigmas[i];
    for (size_t i = 0; i < timesteps.size(); ++i)
      EXPECT_TRUE(within_one_ulp(s.timesteps[i], timesteps[i]))
          << "timestep " << i << ": " << s.timesteps[i] << " vs " << timesteps[i];
    const auto& model_input = c["transformer_timestep_input"];
    for (int64_t i = 0; i < steps; ++i)
      EXPECT_TRUE(within_one_ulp(s.model_timestep(i), model_input[size_t(i)].get<float>()))
          << "model timestep " << i;
  }
}

TEST(Schedule, SigmasAreBitExactForTheE2eCases) {
  // The e2e runs record the timestep the transformer saw at every step.
  const Schedule s = make_schedule(SchedulerConfig{}, 16, 4);
  for (int64_t i = 0; i < 4; ++i) {
    const auto path = testing::tiny_vectors() / "e2e" / "t2i_h64_w64" /
                      ("step" + std::to_string(i) + "_timestep.npy");
    EXPECT_EQ(s.model_timestep(i), read_npy(path).to_f32()[0]) << "step " << i;
  }
}

TEST(Schedule, EmpiricalMuUsesTheLargeImageLineAbove4300Tokens) {
  EXPECT_DOUBLE_EQ(empirical_mu(9216, 4), 0.00016927 * 9216 + 0.45666666);
  EXPECT_DOUBLE_EQ(empirical_mu(9216, 50), empirical_mu(9216, 4));  // no step dependence
  EXPECT_NE(empirical_mu(4300, 4), empirical_mu(4300, 50));
  EXPECT_NEAR(empirical_mu(4096, 4), 2.291180, 1e-6);  // spec f.2 table
}

TEST(Schedule, AnyStepCountEndsAtZeroAndDecreases) {
  for (int64_t steps : {1, 2, 3, 7, 28}) {
    const Schedule s = make_schedule(SchedulerConfig{}, 1024, steps);
    ASSERT_EQ(s.steps(), steps);
    EXPECT_EQ(s.sigmas.front(), 1.0f);
    EXPECT_EQ(s.sigmas.back(), 0.0f);
    for (int64_t i = 0; i < steps; ++i) EXPECT_LT(s.sigmas[size_t(i + 1)], s.sigmas[size_t(i)]);
  }
}

TEST(Schedule, FixedShiftFallbackWarns) {
  SchedulerConfig config;
  config.use_dynamic_shifting = false;
  config.shift = 3.0;
  const Schedule s = make_schedule(config, 4096, 4);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("use_dynamic_shifting"), std::string::npos);
  // σ' = 3σ / (1 + 2σ) at σ = 0.5: 1.5 / 2 = 0.75.
  EXPECT_EQ(s.sigmas[2], 0.75f);
  EXPECT_EQ(s.sigmas[0], 1.0f);
  EXPECT_EQ(s.sigmas[4], 0.0f);
}

TEST(Schedule, RejectsZeroSteps) {
  EXPECT_THROW(make_schedule(SchedulerConfig{}, 16, 0), Error);
}

TEST(Schedule, DefaultStepsFollowDistillation) {
  ModelConfig c;
  c.is_distilled = true;
  EXPECT_EQ(default_steps(c), 4);
  c.is_distilled = false;
  EXPECT_EQ(default_steps(c), 50);
}

TEST(EulerStep, ReproducesTheRecordedSteps) {
  const auto dir = testing::tiny_vectors() / "e2e" / "t2i_h64_w64";
  const Schedule s = make_schedule(SchedulerConfig{}, 16, 4);
  for (int64_t i = 0; i < 4; ++i) {
    const std::string step = "step" + std::to_string(i);
    std::vector<float> x = read_npy(dir / (step + "_latents_in.npy")).to_f32();
    const std::vector<float> v = read_npy(dir / (step + "_velocity.npy")).to_f32();
    const std::vector<float> expected = read_npy(dir / (step + "_latents_out.npy")).to_f32();
    euler_step(x.data(), v.data(), int64_t(x.size()), s.sigmas[size_t(i)], s.sigmas[size_t(i + 1)]);
    for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(x[j], expected[j]) << step << " value " << j;
  }
}

}  // namespace
}  // namespace klein::flux2
