#include "models/zimage/sampler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "models/flow/flow_matching.h"

namespace klein::zimage {

float Schedule::model_time(int64_t i) const { return zimage::model_time(timesteps[size_t(i)]); }

Schedule make_schedule(const SchedulerConfig& config, int64_t steps) {
  check(steps >= 1, "steps: expected at least 1, got ", steps);
  check(!config.use_dynamic_shifting,
        "scheduler: use_dynamic_shifting is true; the Z-Image "
        "pipeline is supported with the static shift of Z-Image-Turbo's scheduler config");
  check(config.shift > 0, "scheduler: shift must be positive, got ", config.shift);
  Schedule s;
  const float train = float(config.num_train_timesteps);
  for (float u : flow::torch_linspace(1.0f, 1.0f / float(steps), steps)) {
    const float sigma = flow::static_shift(config.shift, u);
    s.sigmas.push_back(sigma);
    s.timesteps.push_back(sigma * train);
  }
  s.sigmas.push_back(0.0f);
  return s;
}

bool guided_at(const Guidance& g, const Schedule& s, int64_t i) {
  return g.scale > 0 && !(s.model_time(i) > g.truncation);
}

bool velocity(const float* pos, const float* neg, int64_t n, const Guidance& g, float* v) {
  if (neg == nullptr) {
    for (int64_t i = 0; i < n; ++i) v[i] = -pos[i];
    return false;
  }
  double pos_sq = 0, pred_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float pred = pos[i] + g.scale * (pos[i] - neg[i]);
    v[i] = pred;
    pos_sq += double(pos[i]) * pos[i];
    pred_sq += double(pred) * pred;
  }
  bool rescaled = false;
  if (g.normalization > 0) {
    const float max_norm = float(std::sqrt(pos_sq)) * g.normalization;
    const float norm = float(std::sqrt(pred_sq));
    if (norm > max_norm) {
      const float factor = max_norm / norm;
      for (int64_t i = 0; i < n; ++i) v[i] *= factor;
      rescaled = true;
    }
  }
  for (int64_t i = 0; i < n; ++i) v[i] = -v[i];
  return rescaled;
}

int64_t first_step(int64_t steps, double strength) {
  check(std::isfinite(strength) && strength > 0 && strength <= 1,
        "strength: expected a number in (0, 1], got ", strength);
  const double scaled = std::min(double(steps) * strength, double(steps));
  return int64_t(std::max(double(steps) - scaled, 0.0));
}

Schedule tail(const Schedule& s, int64_t first) {
  check(first >= 0 && first < s.steps(), "internal: first step ", first, " of ", s.steps());
  Schedule t;
  t.timesteps.assign(s.timesteps.begin() + first, s.timesteps.end());
  t.sigmas.assign(s.sigmas.begin() + first, s.sigmas.end());
  return t;
}

void scale_noise(const float* clean, const float* noise, int64_t n, float sigma, float* out) {
  const float keep = 1.0f - sigma;
  for (int64_t i = 0; i < n; ++i) {
    const float noised = sigma * noise[i];
    const float kept = keep * clean[i];
    out[i] = noised + kept;
  }
}

void keep_unmasked(float* x, const float* proper, const float* mask, int64_t channels,
                   int64_t positions) {
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t p = 0; p < positions; ++p) {
      const int64_t i = c * positions + p;
      const float kept = (1.0f - mask[p]) * proper[i];
      const float repainted = mask[p] * x[i];
      x[i] = kept + repainted;
    }
}

}  // namespace klein::zimage
