#include "ops/timestep.h"

#include <cmath>

namespace klein::ops {

void timestep_sinusoid(float tau, float* out, int64_t channels) {
  const int64_t half = channels / 2;
  const float log_period = float(-std::log(10000.0));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = log_period * float(i) / float(half);
    const float frequency = float(std::exp(double(exponent)));
    const float angle = tau * frequency;
    out[i] = float(std::cos(double(angle)));
    out[half + i] = float(std::sin(double(angle)));
  }
}

}  // namespace klein::ops
