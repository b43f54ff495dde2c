#include "models/flux2/schedule.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace klein::flux2 {

namespace {

// The scheduler's time shifts, evaluated the way numpy evaluates them on a float32 array
// with Python float scalars: every scalar is rounded to float32 and every operation is a
// float32 operation.
float exponential_shift(float exp_mu, float s) {
  const float odds = 1.0f / s - 1.0f;
  return exp_mu / (exp_mu + odds);
}

float linear_shift(float mu, float s) {
  const float odds = 1.0f / s - 1.0f;
  return mu / (mu + odds);
}

}  // namespace

int64_t default_steps(const ModelConfig& config) {
  // Flux2KleinPipeline: 4 for the distilled klein, 50 for base; Flux2Pipeline (FLUX.2-dev,
  // guidance-distilled, not step-distilled): 50.
  return config.is_distilled && !config.transformer.guidance_embeds ? 4 : 50;
}

double empirical_mu(int64_t image_tokens, int64_t steps) {
  // Two lines fitted by BFL: μ at 10 and at 200 steps as a function of the token count,
  // interpolated linearly in the step count; above 4300 tokens only the 200-step line.
  const double a1 = 8.73809524e-05, b1 = 1.89833333;
  const double a2 = 0.00016927, b2 = 0.45666666;
  const double tokens = double(image_tokens);
  if (image_tokens > 4300) return a2 * tokens + b2;
  const double mu_200 = a2 * tokens + b2;
  const double mu_10 = a1 * tokens + b1;
  const double slope = (mu_200 - mu_10) / 190.0;
  const double intercept = mu_200 - 200.0 * slope;
  return slope * double(steps) + intercept;
}

float Schedule::model_timestep(int64_t i) const {
  check(i >= 0 && i < steps(), "schedule: step ", i, " out of range [0, ", steps(), ")");
  return timesteps[size_t(i)] / 1000.0f;
}

Schedule make_schedule(const SchedulerConfig& config, int64_t image_tokens, int64_t steps) {
  check(steps >= 1, "steps: expected at least 1, got ", steps);
  check(image_tokens >= 1, "schedule: expected at least one image token, got ", image_tokens);
  check(config.num_train_timesteps >= 1, "scheduler: num_train_timesteps must be positive, got ",
        config.num_train_timesteps);

  Schedule s;
  const std::vector<double> unshifted = flow::numpy_linspace(1.0, 1.0 / double(steps), steps);
  s.sigmas.reserve(size_t(steps + 1));
  if (config.use_dynamic_shifting) {
    s.mu = empirical_mu(image_tokens, steps);
    const bool exponential = config.time_shift_type == "exponential";
    check(exponential || config.time_shift_type == "linear", "scheduler: time_shift_type \"",
          config.time_shift_type, "\" is not supported (expected exponential or linear)");
    const float exp_mu = float(std::exp(s.mu));
    for (double u : unshifted)
      s.sigmas.push_back(exponential ? exponential_shift(exp_mu, float(u))
                                     : linear_shift(float(s.mu), float(u)));
    if (!exponential)
      s.warnings.push_back(
          "scheduler: time_shift_type is \"linear\"; FLUX.2-klein was published with the "
          "exponential shift, images may differ from the official pipeline");
  } else {
    for (double u : unshifted) s.sigmas.push_back(flow::static_shift(config.shift, float(u)));
    std::ostringstream w;
    w << "scheduler: use_dynamic_shifting is false, using the fixed shift " << config.shift
      << " instead of the resolution-dependent one; FLUX.2-klein expects dynamic shifting";
    s.warnings.push_back(w.str());
  }
  const float train_steps = float(config.num_train_timesteps);
  for (float sigma : s.sigmas) s.timesteps.push_back(sigma * train_steps);
  s.sigmas.push_back(0.0f);
  return s;
}

}  // namespace klein::flux2
