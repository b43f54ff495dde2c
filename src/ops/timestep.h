#pragma once
// The sinusoidal timestep embedding of the diffusion transformers (FLUX.2, Z-Image).
#include <cstdint>

namespace klein::ops {

// out = [cos(τ f_0) … cos(τ f_{h−1}), sin(τ f_0) … sin(τ f_{h−1})], h = channels / 2,
// f_i = 10000^(−i/h), in the official float32 steps (exponent, exp, product each rounded to
// float32). At τ ≈ 1000 the arguments are ~1000 rad, so the float32 product is what must
// match, not the exact angle.
void timestep_sinusoid(float tau, float* out, int64_t channels);

}  // namespace klein::ops
