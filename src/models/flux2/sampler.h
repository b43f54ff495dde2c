#pragma once
// The denoising loop of the FLUX.2-klein pipeline: Euler steps over a flow-matching schedule,
// with the target tokens evolving and the text and reference tokens fixed.
//
//   once         RoPE table, text embedding(s), reference embeddings, every step's
//                modulation(σ_i) (all that reads "transformer.shared", which is then
//                released), activation memory
//   every step   v = model(x, σ_i) [+ unconditional pass for CFG]; x ← x + (σ_{i+1} − σ_i)·v
//
// The K/V pipeline (a checkpoint whose configuration says reference_cache, i.e. FLUX.2-klein-
// 9b-kv): the references run once through every block, alone and at timestep 0, and every
// step attends to their cached keys and values instead of carrying their tokens
// (Transformer::cache_references).
//
// Classifier-free guidance (klein-base only, i.e. is_distilled false, and guidance > 1):
// a second forward with the negative context, v = v_u + g·(v_c − v_u). The distilled klein
// ignores guidance, as the official pipeline does. FLUX.2-dev (guidance-distilled: its
// transformer has a guidance embedder) gives the scale to the model at every step and runs
// one forward per step.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "models/flux2/positions.h"
#include "models/flux2/schedule.h"
#include "models/flux2/transformer.h"
#include "weights/weight_store.h"

namespace klein::flux2 {

// What a step callback sees; tensors are [N_img, 128] packed target tokens, valid only during
// the call.
struct StepInfo {
  int64_t step = 0;        // 0-based
  int64_t steps = 0;
  float sigma = 0;         // σ_i
  float sigma_next = 0;    // σ_{i+1}
  float timestep = 0;      // the value the transformer received (schedule timestep / 1000)
  const Tensor& latents_in;
  const Tensor& velocity;  // after guidance, what the Euler step used
  const Tensor& latents_out;
};
using StepCallback = std::function<void(const StepInfo&)>;

struct SamplerInputs {
  const Tensor* context = nullptr;           // [T, context_dim] prompt embedding (T = 512)
  const Tensor* negative_context = nullptr;  // [T, context_dim] for CFG: the "" prompt's embedding
  const Tensor* noise = nullptr;             // [N_img, in_channels] initial packed noise
  LatentGrid target;                         // N_img = target.rows · target.cols
  std::vector<ReferenceTokens> references;   // clean reference tokens, in order
  Schedule schedule;                         // make_schedule(config.scheduler, N_img, steps)
  float guidance = 1.0f;                     // CFG scale (klein-base), embedded (FLUX.2-dev)
  StepCallback on_step;                      // progress, dumps; may be empty
  // Called after each Euler update, before on_step, to change the latents (inpainting puts
  // the init image back outside the mask); may be empty.
  std::function<void(int64_t step, Tensor& latents)> after_update;
  const Adapters* adapters = nullptr;        // LoRA updates of the transformer; may be null
};

struct SamplerResult {
  Tensor latents;                      // [N_img, in_channels] final packed latents
  std::vector<std::string> warnings;   // e.g. guidance ignored by a distilled model
  size_t activation_bytes = 0;         // the planned activation memory of the loop
  double setup_seconds = 0;            // the once-per-generation work before step 0
  std::vector<double> step_seconds;    // each step's forward pass(es) and update (no callback)
};

// Latents [C, h, w] (channel-first, as noise is drawn) ↔ packed tokens [h·w, C], token r·w + c.
Tensor pack_latents(const Tensor& chw);
Tensor unpack_latents(const Tensor& tokens, LatentGrid grid);

// True when the pipeline would run classifier-free guidance for this model and scale.
bool uses_guidance(const ModelConfig& config, float guidance);

// Runs the whole loop and returns the final packed latents. The schedule's own warnings are
// not repeated in the result.
SamplerResult sample(WeightStore& store, const SamplerInputs& in, Compute& cx);

// The loops of a batch of images that differ only in their prompt contexts, noise and
// callbacks (the same target grid, schedule, guidance, references and adapters: refused by
// name otherwise), run together: every step, each transformer block is acquired once for all
// of them and its projections run over all their rows at once (Transformer::forward with
// lanes); the references are embedded (and their K/V cached) once. Each result is the one
// sample() gives that image alone, bit for bit; step_seconds are the batch's steps.
std::vector<SamplerResult> sample_batch(WeightStore& store, std::span<const SamplerInputs> batch,
                                        Compute& cx);

}  // namespace klein::flux2
