#pragma once
// The FLUX.2-klein pipeline, prompt (and reference images) to picture, as the official
// Flux2KleinPipeline does it:
//
//   prompt → chat template → tokens (512) → Qwen3 layers 1..27 → context [512, 3·hidden]
//   seed → noise [128, H/16, W/16] → packed tokens;  references → VAE encode → tokens
//   for each σ: transformer (text | target | references) → velocity → Euler step
//   tokens → unpack, BatchNorm de-normalise, unpatchify → VAE decode → pixels
//
// Each network holds its weights only while it runs, so the text encoder is gone before
// denoising starts and the VAE decoder is loaded only at the end. Before the first one runs,
// the pipeline estimates the memory of this generation (memory_plan.h) and sets the store's
// residency: resident when the budget allows, paged otherwise; after each network it
// releases that network's units (a resident store drops them then).
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/threadpool.h"
#include "formats/image/image.h"
#include "pipeline/memory_plan.h"
#include "pipeline/progress.h"
#include "tokenizer/tokenizer.h"
#include "weights/weight_store.h"

namespace klein {

// The arithmetic of the activations.
//   Exact  float32 everywhere (what the golden tests compare against).
//   Fast   bf16 tiles on CPUs with AMX for the transformer (attention and float-weight
//          projections) and the VAE's convolutions; the text encoder stays float32. Other
//          CPUs: exact. Q8 / Q4 projections use their own kernels either way.
//   Auto   Fast when the transformer's weights are quantized (the image is an approximation
//          already), Exact otherwise.
enum class Precision { Auto, Exact, Fast };

struct GenerateOptions {
  std::string prompt;
  std::string negative_prompt;                    // CFG only (klein-base); "" by default
  int64_t width = 0, height = 0;                  // 0: the first reference's size, else 1024
  int64_t steps = 0;                              // 0: 4 for distilled klein, 50 for base
  std::optional<uint64_t> seed;                   // none: drawn from the OS
  std::optional<float> guidance;                  // none: 4.0 for base, 1.0 for distilled
  std::vector<std::filesystem::path> references;  // reference images for editing, in order
  std::filesystem::path noise_file;               // optional [1, 128, H/16, W/16] float32 .npy
  std::filesystem::path dump_dir;                 // optional: write every stage as .npy here
  std::optional<std::filesystem::path> prompt_cache_dir;  // none: no prompt cache
  // Memory: plan and set the store's residency (false: leave the store as it is), within
  // max_memory bytes (none: the default budget from the available memory).
  bool plan_memory = true;
  std::optional<uint64_t> max_memory;
  std::optional<Residency> residency;  // force a residency (still checked against max_memory)
  bool plan_only = false;              // stop after the memory plan (result without an image)
  Precision precision = Precision::Auto;
};

// Peak RSS during one phase.
struct PhaseMemory {
  std::string phase;
  uint64_t start_rss_bytes = 0;  // RSS when the phase started (what earlier phases left)
  uint64_t peak_rss_bytes = 0;
  bool exact = true;  // false: the kernel's mark could not be reset; this is the peak so far
};

struct GenerateResult {
  Image image;
  uint64_t seed = 0;
  int64_t width = 0, height = 0, steps = 0;
  float guidance = 1;
  bool context_from_cache = false;
  bool fast = false;  // the precision used: true = Fast (see Precision)
  std::vector<std::pair<std::string, double>> timings;  // phase → seconds, in order
  double denoise_setup_seconds = 0;   // embeddings and all steps' modulation, before step 0
  std::vector<double> step_seconds;   // each denoising step
  std::vector<PhaseMemory> phase_memory;  // peak RSS per phase, in order
  std::optional<MemoryPlan> memory;       // when options.plan_memory
  ResidencyStats weights;                 // units resident at once: the peak over the run
  std::vector<std::string> warnings;
};

// The size the pipeline produces for a requested size: floored to multiples of 16.
int64_t floor_to_multiple(int64_t value, int64_t multiple);

class Pipeline {
 public:
  // All three must outlive the pipeline.
  Pipeline(WeightStore& store, const Tokenizer& tokenizer, ThreadPool& pool);
  GenerateResult generate(const GenerateOptions& options, Progress& progress);

 private:
  WeightStore& store_;
  const Tokenizer& tokenizer_;
  ThreadPool& pool_;
};

// The A1111-style "parameters" text and a JSON description of a generation, for the
// image file's metadata.
std::string parameters_text(const GenerateOptions& options, const GenerateResult& result,
                            const std::string& model_name);
std::string parameters_json(const GenerateOptions& options, const GenerateResult& result,
                            const std::string& model_name, const std::string& model_checksum);

}  // namespace klein
