#pragma once
// How a model family runs the pipeline's stages (pipeline.h: start, encode_prompt,
// prepare_latents, denoise, decode). A Session holds the stages of its model's family
// (ModelConfig::family), chosen in families.cpp; each family's stages are one file here:
// flux2_stages.cpp (FLUX.2-klein: text-to-image, references, image-to-image, inpainting, the
// K/V cache, LoRA; FLUX.2-dev: the same stages with its prompt and embedded guidance) and zimage_stages.cpp (Z-Image: text-to-image with CFG options). The front
// ends see none of this: they call the Session.
#include "core/memory.h"
#include "pipeline/pipeline.h"

namespace klein {

class FamilyStages {
 public:
  virtual ~FamilyStages() = default;
  // What the family's pipelines take beyond a prompt (for front ends that show only those).
  virtual Capabilities capabilities(const ModelConfig& config) const = 0;
  // g.options is set and the common bookkeeping done (peak marks, the model's files); the
  // family fills g.result's sizes, steps, guidance, seed, precision and memory plan, and
  // checks every option it can before any network runs (options it does not support are
  // refused by name).
  virtual void start(Session& s, Generation& g, Progress& progress) const = 0;
  virtual void encode_prompt(Session& s, Generation& g, Progress& progress,
                             const TextLayerHook& on_layer) const = 0;
  virtual void prepare_latents(Session& s, Generation& g, Progress& progress) const = 0;
  virtual void denoise(Session& s, Generation& g, Progress& progress,
                       const StepHook& on_step) const = 0;
  virtual void decode(Session& s, Generation& g, Progress& progress) const = 0;
};

const FamilyStages& flux2_stages();
const FamilyStages& flux2_dev_stages();
const FamilyStages& zimage_stages();
// The stages of the configuration's family; throws naming a family without stages.
const FamilyStages& stages_for(const ModelConfig& config);

// The output size from the requested one: at least 16 and at most 8192 pixels a side, floored to
// a multiple of `multiple` with a warning naming both sizes. Sets g.result's width and height.
void settle_output_size(Session& s, Generation& g, Progress& progress, int64_t width,
                        int64_t height, int64_t multiple);

// Refuses to finish when a model file has changed since start (rewritten or replaced under
// the mapping: the image could mix two models).
void check_model_files_unchanged(const Generation& g);

// Runs one phase: its time, and the peak RSS while it ran, into the result.
template <class Fn>
void Session::timed(Generation& g, Progress& progress, const std::string& name, int total,
                    Fn&& fn) {
  cx_.stop_if_cancelled();
  return_free_memory();  // what the previous phase freed
  const bool exact = reset_peak_rss();
  const uint64_t start_rss = current_rss_bytes();
  {
    Phase phase(progress, name, total);
    fn(phase);
    g.result.timings.emplace_back(name, phase.seconds());
  }
  g.result.phase_memory.push_back(
      {name, start_rss, exact ? peak_rss_since_reset() : peak_rss_bytes(), exact});
}

}  // namespace klein
