#pragma once
// What the flow-matching pipelines share (diffusers' FlowMatchEulerDiscreteScheduler): the
// step grids, the static shift and the Euler update, each in the official float roundings.
// The families' schedules (models/flux2/schedule.h, models/zimage/sampler.h) build on these.
#include <cstdint>
#include <vector>

namespace klein::flow {

// numpy.linspace(start, stop, n) in float64: i·step + start, the last value exactly `stop`.
std::vector<double> numpy_linspace(double start, double stop, int64_t n);

// torch.linspace(start, end, n) in float32 by its scalar formula: a float32 step, the first
// half counted from the start, the second from the end.
std::vector<float> torch_linspace(float start, float end, int64_t n);

// The static time shift σ' = shift·σ / (1 + (shift − 1)·σ), each operation in float32 (numpy
// on a float32 array with a Python float).
float static_shift(double shift, float sigma);

// x ← x + (σ_next − σ) · v over n values, in float32 with the official rounding (the
// difference, then the product, then the sum, each rounded).
void euler_step(float* latents, const float* velocity, int64_t n, float sigma, float sigma_next);

}  // namespace klein::flow
