#pragma once
// Checkpoint -> container (docs/container.md). The source is any model open_model() accepts
// (the diffusers directory, single files, or another container); every tensor inference
// reads is stored at the type the precision policy gives it, packed in the layout the
// kernels want; what inference never reads (text-encoder layers past the last one used, the
// final norm, lm_head, BatchNorm's batch counter) is dropped and the drop recorded.
//
// Streaming: one unit is acquired from the source at a time and its tensors converted in
// slices of rows, so memory stays at a few tens of MB plus the source pages of the slice
// being read (dropped after use), whatever the size of the model. The output is written
// under a temporary name and renamed when complete; an error or a cancellation removes it.
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>

#include "core/dtype.h"
#include "formats/container/format.h"
#include "weights/extra_component.h"
#include "weights/lora.h"
#include "weights/model_source.h"

namespace klein::convert {

class SourceArrival;

struct ConvertProgress {
  size_t unit = 0;  // 1-based index of the unit just written
  size_t units = 0;
  std::string name;
  uint64_t source_bytes = 0;   // source tensor bytes read so far
  uint64_t written_bytes = 0;  // container bytes written so far
  double seconds = 0;          // since the first unit began
};

struct ConvertOptions {
  ModelPaths source;
  std::filesystem::path output;
  DType target = DType::Q4;
  // -t keep: every tensor's target is the type that keeps its precision class in the source
  // (keep_precision in convert/policy.h; `target` is then unused); the policy still applies.
  bool keep = false;
  // Keep what prompt upsampling reads besides: the text encoder's later layers, its final
  // norm and an untied lm_head (stored by the same policy).
  bool keep_llm = false;
  std::string policy_text;    // the user's policy rules; empty: the built-in defaults only
  std::string policy_origin;  // where they came from (file name), for errors and the record
  uint64_t alignment = container::kMinAlignment;
  int threads = 0;                                // packing threads; <= 0: one per hardware thread
  std::function<void(const std::string&)> stage;  // "opening the source model", ...
  std::function<void(const ConvertProgress&)> progress;  // after each unit
  // Told the temporary file's name as soon as it exists (for a signal handler that has to
  // remove it on a second interrupt).
  std::function<void(const std::filesystem::path&)> on_temp_file;
  // Checked between slices; when it becomes true the conversion stops with an error and
  // the temporary file is removed.
  const std::atomic<bool>* cancel = nullptr;
  // LoRAs merged into the transformer's weights before they are stored: W + s·B·A in float32
  // (weights/lora.h), recorded in the container's conversion metadata.
  std::vector<LoraFile> loras;
  // Source files that are still downloading (klein pull): each tensor's bytes are waited
  // for before they are read and given back once stored (convert/arrival.h). The container
  // is the same, byte for byte.
  SourceArrival* arrival = nullptr;
  // Converts this store instead of opening `source` (klein synth -t: synthetic weights made
  // in memory); the tokenizer files still come from source.tokenizer.
  WeightStore* store = nullptr;
  // The safety classifier's Hugging Face directory (klein convert --safety-model): its tensors
  // stored beside the model's under the same policy, its configuration in the metadata's
  // "safety" object (weights/safety_model.h). A container source's classifier is carried over
  // unless this names another.
  std::filesystem::path safety_model;
  // A control model of the model's family (klein convert --controlnet: what the family's
  // ModelFamily::open_control_model opens), checked against the model
  // and stored beside it under the same policy, its configuration in the metadata's
  // "controlnet" object (ModelFamily::open_control_model). A container source's is carried over
  // unless this names another.
  std::filesystem::path controlnet;
  // Other networks to store beside the model, opened by the caller's functions once the
  // source's configuration is known, against it (the tiny autoencoder's decoder:
  // pipeline/tiny_decoder.h); each replaces a container source's of its key.
  std::vector<std::function<ExtraComponent(const ModelConfig&)>> extra_components;
};

struct TypeTotals {
  size_t tensors = 0;
  uint64_t parameters = 0;
  uint64_t bytes = 0;
};

struct ConvertSummary {
  std::filesystem::path output;
  uint64_t file_bytes = 0;
  size_t units = 0;
  size_t tensors = 0;
  size_t dropped = 0;
  std::map<std::string, TypeTotals> by_type;  // "q4" -> totals
  double hash_seconds = 0;                    // hashing the source files, on a thread of its own
  double convert_seconds = 0;                 // writing the units, metadata and index
};

ConvertSummary convert_model(const ConvertOptions& options);

}  // namespace klein::convert
