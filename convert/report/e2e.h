#pragma once
// End to end: the same generations (prompt, seed, size, steps) run with the reference and
// with the candidate, compared stage by stage:
//
//   text encoder   the residual stream after every layer and the context (candidate run with
//                  its own weights from the same tokens)
//   denoising      the latents after every Euler step and at the end (each run on its own
//                  context, from the same noise)
//   image          PSNR and SSIM of the decoded images, and the amplified difference
//   tiny decoder   with one (E2eOptions::tiny): the reference's final latents decoded by it
//                  against the full decoder's image of them, PSNR and SSIM (what decoding
//                  with `--decoder tiny` trades for its speed)
//
// Transformer blocks are probed at one step of the first case, on the reference run's
// latents and context at that step, in two ways:
//   accumulated    the whole candidate transformer against the whole reference: each block's
//                  output error includes what the blocks before it passed on
//   isolated       one forward per unit with only that unit from the candidate (MixedStore):
//                  every block sees exactly the reference's activations, so the error at its
//                  output is its own; the same forward gives its effect on the velocity
// The isolated probes (and one forward with the candidate's context on the reference
// transformer, and the candidate's VAE decoding the reference latents) are the measured
// sensitivities the policy search works from.
//
// Every family's model is measured the same way: the generations are the pipeline's stages,
// and the probes the family's transformer and decoder one forward at a time
// (FamilyStages::transformer_blocks, probe_forward and decode_latents, pipeline/stages.h):
// FLUX.2-klein's double and single blocks, Z-Image's noise refiner, context refiner and main
// layers. A block's error is over its real tokens (the text and the image rows, padding left
// out); the probe's forward is the conditional one (the prompt's context, no guidance).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "formats/image/image.h"
#include "pipeline/pipeline.h"
#include "pipeline/progress.h"
#include "convert/report/metrics.h"
#include "tokenizer/tokenizer.h"
#include "weights/weight_store.h"

namespace klein {
class FamilyStages;
}

namespace klein::report {

struct E2eCase {
  std::string prompt;
  uint64_t seed = 0;
  int64_t width = 0, height = 0;  // multiples of 16
  int64_t steps = 0;              // 0: the model's default
};

// The built-in set: two prompts with fixed seeds at 256x256 (64x64 for test-sized models,
// whose transformer stream is narrower than 1024), the model's default steps. Any of prompts,
// seeds, width, height, steps given (non-empty / non-zero) replaces the default; the i-th
// prompt takes the i-th seed, the last seed repeating.
std::vector<E2eCase> make_cases(const ModelConfig& config, const std::vector<std::string>& prompts,
                                const std::vector<uint64_t>& seeds, int64_t width,
                                int64_t height, int64_t steps);

enum class BlockProbes { None, Accumulated, Isolated, Both };
BlockProbes parse_block_probes(const std::string& s);  // "none", "accumulated", ...
std::string block_probes_name(BlockProbes p);

struct E2eOptions {
  std::vector<E2eCase> cases;
  // The arithmetic of each model's generations: what `klein generate` would use for it
  // (runs_fast: Auto is fast for quantized transformers, on AMX CPUs bf16 tiles).
  Precision precision = Precision::Auto;
  BlockProbes blocks = BlockProbes::Both;
  int64_t probe_step = 0;  // the step of the first case whose inputs the probes use
  TinyDecoderOptions tiny;  // with a model: the tiny decoder against the full one
};

// The tiny decoder's image of the reference's final latents against the full decoder's.
struct TinyDecoding {
  std::string file;    // the tiny decoder's file name
  ErrorSummary image;  // pixel values in [0, 1]
  double psnr_db = 0, ssim = 1;
  Image tiny_image;
};

struct CaseResult {
  E2eCase spec;  // with the steps resolved
  ErrorSummary context;
  std::vector<ErrorSummary> text_layers;  // [k - 1]: the stream after decoder layer k
  std::vector<ErrorSummary> step_latents;  // [i]: the latents after Euler step i
  ErrorSummary final_latents;
  ErrorSummary image;  // pixel values in [0, 1], before rounding to 8 bits
  double psnr_db = 0, ssim = 1;
  Image reference_image, candidate_image, difference_image;
  double difference_gain = 1;  // the difference image shows |candidate - reference| x gain
  std::optional<TinyDecoding> tiny;  // with E2eOptions::tiny
};

struct BlockError {
  std::string name;  // "transformer_blocks.0", "single_transformer_blocks.3", "layers.2"
  std::string unit;  // "transformer.double.0", "transformer.single.3", "transformer.layer.2"
  std::optional<ErrorSummary> accumulated;
  std::optional<ErrorSummary> isolated;
};

// The velocity error (NMSE) when only `group`'s weights come from the candidate.
struct Sensitivity {
  std::string group;  // a transformer unit, or "text_encoder" (through its context)
  double velocity_nmse = 0;
};

struct BlockProbe {
  int64_t step = 0;
  float timestep = 0;
  std::vector<BlockError> blocks;
  std::optional<ErrorSummary> velocity;  // the whole candidate transformer (accumulated run)
  std::vector<Sensitivity> sensitivities;  // isolated runs, one per transformer unit + text
  double isolated_velocity_nmse_sum = 0;   // Σ of the transformer units' (additivity check)
  double vae_image_mse = 0;  // the candidate's VAE on the reference latents, vs the reference
};

struct E2eResult {
  bool reference_fast = false, candidate_fast = false;  // the precision each model ran at
  std::vector<CaseResult> cases;
  std::optional<BlockProbe> probe;
  double mean_image_mse = 0;  // over the cases, pixel values in [0, 1]
};

// The reference side is run once and kept (contexts, every step's latents, the images, the
// block outputs at the probe step), so that several candidates (the policy search verifies
// its proposals) are each compared for the price of their own runs.
class E2eSession {
 public:
  // Runs the reference generations and the reference forward of the block probes. The store,
  // tokenizer and compute context must outlive the session.
  E2eSession(WeightStore& reference, const Tokenizer& tokenizer, Compute& cx,
             E2eOptions options, Progress& progress);
  ~E2eSession();
  E2eSession(const E2eSession&) = delete;
  E2eSession& operator=(const E2eSession&) = delete;

  // The candidate's generations and probes against the reference's (the same model).
  E2eResult compare(WeightStore& candidate, Progress& progress);

 private:
  struct ReferenceCase;
  struct ReferenceProbe;
  BlockProbe run_probes(WeightStore& candidate, const Tensor& candidate_context,
                        Progress& progress);
  TinyDecoding tiny_decoding(const Tensor& latents, LatentGrid grid,
                             const std::vector<float>& full, int height, int width);
  WeightStore& reference_;
  const Tokenizer& tokenizer_;
  Compute& cx_;
  const FamilyStages& stages_;  // the model family's: its transformer and decoder, one by one
  bool reference_fast_ = false;
  E2eOptions options_;
  std::vector<ReferenceCase> cases_;
  std::unique_ptr<ReferenceProbe> probe_;
};

// Both stores must be the same model; `tokenizer` tokenizes the prompts for both runs.
E2eResult run_e2e(WeightStore& reference, WeightStore& candidate, const Tokenizer& tokenizer,
                  Compute& cx, const E2eOptions& options, Progress& progress);

}  // namespace klein::report
