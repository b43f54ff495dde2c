#include "models/flow/flow_matching.h"

namespace klein::flow {

std::vector<double> numpy_linspace(double start, double stop, int64_t n) {
  if (n == 1) return {start};
  std::vector<double> y(static_cast<size_t>(n));
  const double step = (stop - start) / double(n - 1);
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = double(i) * step + start;
  y[size_t(n - 1)] = stop;
  return y;
}

std::vector<float> torch_linspace(float start, float end, int64_t n) {
  if (n == 1) return {start};
  std::vector<float> y(static_cast<size_t>(n));
  const float step = (end - start) / float(n - 1);
  const int64_t halfway = n / 2;
  for (int64_t i = 0; i < n; ++i)
    y[size_t(i)] = i < halfway ? start + step * float(i) : end - step * float(n - 1 - i);
  return y;
}

float static_shift(double shift, float sigma) {
  const float scaled = float(shift) * sigma;
  const float denominator = 1.0f + float(shift - 1.0) * sigma;
  return scaled / denominator;
}

void euler_step(float* latents, const float* velocity, int64_t n, float sigma, float sigma_next) {
  // Separate roundings of dt, dt·v and the sum, like the scheduler's float32 torch ops. The
  // baseline build does not contract a·b + c into an FMA; a fused build would differ in the
  // last bit (the e2e tests compare the stored steps).
  const float dt = sigma_next - sigma;
  for (int64_t i = 0; i < n; ++i) {
    const float change = dt * velocity[i];
    latents[i] = latents[i] + change;
  }
}

}  // namespace klein::flow
