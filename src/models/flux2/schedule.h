#pragma once
// The flow-matching noise schedule of the FLUX.2-klein pipeline and its Euler update.
//
// Official recipe (diffusers Flux2KleinPipeline + FlowMatchEulerDiscreteScheduler):
//   s_i  = linspace(1, 1/n, n)                         float64, then rounded to float32
//   mu   = empirical_mu(target tokens, n)              float64
//   σ_i  = e^mu / (e^mu + (1/s_i − 1))                 float32 (e^mu rounded to float32 first)
//   σ_n  = 0                                           appended
//   t_i  = σ_i · 1000                                  float32, the scheduler's "timesteps"
// The pipeline hands the transformer t_i / 1000 (float32) and the transformer multiplies it
// by 1000 again (float32); both roundings are kept so the model sees the official value.
#include <cstdint>
#include <string>
#include <vector>

#include "models/flow/flow_matching.h"
#include "weights/config.h"

namespace klein::flux2 {

// Steps used when the caller does not choose: 4 for the distilled klein, 50 for klein-base
// (the pipeline's own default).
int64_t default_steps(const ModelConfig& config);

// The pipeline's empirical μ from the number of TARGET image tokens (text and reference
// tokens do not count) and the step count; float64 throughout.
double empirical_mu(int64_t image_tokens, int64_t steps);

struct Schedule {
  double mu = 0;                   // the μ used; 0 when the scheduler has no dynamic shifting
  std::vector<float> sigmas;       // steps + 1 values, the last one exactly 0
  std::vector<float> timesteps;    // steps values: sigmas[i] · num_train_timesteps, float32
  std::vector<std::string> warnings;  // for the caller to show (e.g. a non-official shift)

  int64_t steps() const { return int64_t(timesteps.size()); }
  // What the transformer receives at step i: timesteps[i] / 1000 in float32.
  float model_timestep(int64_t i) const;
};

// The schedule for `steps` steps over a target of `image_tokens` tokens. With
// use_dynamic_shifting (the klein configuration) σ is shifted by μ (exponential or linear
// time shift); without it the fixed shift σ' = shift·σ / (1 + (shift − 1)·σ) is applied and
// a warning says so, since the distilled model was trained for the μ-shifted schedule.
Schedule make_schedule(const SchedulerConfig& config, int64_t image_tokens, int64_t steps);

using flow::euler_step;

}  // namespace klein::flux2
