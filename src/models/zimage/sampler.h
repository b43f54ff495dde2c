#pragma once
// The Z-Image pipeline's schedule, guidance and Euler update (diffusers ZImagePipeline with
// FlowMatchEulerDiscreteScheduler), in the official float32 steps:
//   s_i   = torch.linspace(1, 1/n, n) in float32 (torch's two-sided formula)
//   σ_i   = shift·s / (1 + (shift − 1)·s)          static shift (use_dynamic_shifting false:
//                                                  the schedule does not depend on the size)
//   σ_n   = 0;  timestep_i = σ_i · 1000
//   t_i   = (1000 − timestep_i) / 1000             the transformer's model time (0 = noise)
//   CFG   on when guidance > 0 (not > 1), skipped at steps whose t_i > cfg_truncation;
//         pred = pos + g·(pos − neg), rescaled to c·‖pos‖ when cfg_normalization c > 0 and
//         ‖pred‖ > c·‖pos‖ (L2 over the whole latent)
//   v     = −pred (the model predicts the negative velocity)
//   x    ← x + (σ_{i+1} − σ_i)·v
//
// Image-to-image and inpainting (ZImageImg2ImgPipeline, ZImageInpaintPipeline) run the last
// steps of the same schedule, from the image's latents noised to the σ where they start:
//   first = int(max(n − min(n·strength, n), 0))     (double, as Python computes it)
//   x     = σ_first·noise + (1 − σ_first)·x0        (the scheduler's scale_noise, float32)
// and inpainting, after every step, puts the kept part back:
//   x     = (1 − m)·proper + m·x,  proper = σ_{i+1}·noise + (1 − σ_{i+1})·x0, x0 at the last
// with the mask m (1: repaint) at latent size, the same over every channel.
#include <cstdint>
#include <vector>

#include "models/flow/flow_matching.h"
#include "weights/config.h"

namespace klein::zimage {

// The transformer's time input for a scheduler timestep: (1000 − timestep) / 1000 in float32.
inline float model_time(float timestep) { return (1000.0f - timestep) / 1000.0f; }

struct Schedule {
  std::vector<float> sigmas;     // steps + 1, the last 0
  std::vector<float> timesteps;  // steps: σ · num_train_timesteps
  int64_t steps() const { return int64_t(timesteps.size()); }
  // The transformer's time input at step i: model_time(timesteps[i]).
  float model_time(int64_t i) const;
};

// Refuses a scheduler configuration it does not reproduce (dynamic shifting), naming it.
Schedule make_schedule(const SchedulerConfig& config, int64_t steps);

struct Guidance {
  float scale = 0;          // > 0: CFG with the negative prompt
  float normalization = 0;  // cfg_normalization: 0 off (False), 1 for True, or the factor c
  float truncation = 1;     // cfg_truncation: steps with model time above it run unguided
};

// Whether step i runs the negative prompt too.
bool guided_at(const Guidance& g, const Schedule& s, int64_t i);

// The velocity the Euler update uses, from the model's outputs over n values: −pred with
// guidance (neg given), −pos without (neg null). Returns whether pred was rescaled.
bool velocity(const float* pos, const float* neg, int64_t n, const Guidance& g, float* v);

using flow::euler_step;

// The first step of `steps` that runs at `strength` in (0, 1] (see above).
int64_t first_step(int64_t steps, double strength);
// The schedule from step `first` on (its timesteps and σs, the final 0 kept).
Schedule tail(const Schedule& s, int64_t first);
// σ·noise + (1 − σ)·clean over n values, in float32 (FlowMatchEulerDiscreteScheduler's
// scale_noise).
void scale_noise(const float* clean, const float* noise, int64_t n, float sigma, float* out);
// Inpainting's blend of latents [channels, positions]: where mask[p] is 0 the value becomes
// proper's, where 1 it stays; (1 − m)·proper + m·x in float32.
void keep_unmasked(float* x, const float* proper, const float* mask, int64_t channels,
                   int64_t positions);

}  // namespace klein::zimage
