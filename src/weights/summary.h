#pragma once
// What `klein inspect` reports about a model given as its original files: per component the
// files, the name layout, where the configuration came from, and tensor / parameter / byte
// counts by dtype and by weight unit; then the totals. Everything comes from the safetensors
// headers: no tensor data is read.
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "weights/config.h"
#include "weights/model_source.h"
#include "weights/naming.h"

namespace klein {

class SourceStore;

struct TensorCounts {
  int64_t tensors = 0;
  int64_t parameters = 0;  // elements of float tensors (integer buffers are not parameters)
  uint64_t bytes = 0;      // bytes as stored

  void add(DType dtype, const Shape& shape);
  TensorCounts& operator+=(const TensorCounts& o);
};

struct UnitSummary {
  std::string name;  // "transformer.double.0"
  TensorCounts counts;
  // False for units a checkpoint carries but the pipeline never computes with: Qwen3 layers
  // after the last hidden state it reads, and the final norm.
  bool read_by_inference = true;
};

struct ComponentSummary {
  Component component = Component::Transformer;
  Layout layout = Layout::Diffusers;
  std::vector<std::filesystem::path> files;    // the safetensors files (all shards)
  std::filesystem::path index_file;            // the shard index, if sharded
  std::filesystem::path config_file;           // empty: configuration read from tensor shapes
  TensorCounts counts;                         // every tensor in the files
  std::map<std::string, TensorCounts> dtypes;  // by dtype name, over the files
  std::vector<UnitSummary> units;              // canonical tensors by unit, in model order
  std::vector<std::string> unused;             // tensors no unit holds (lm_head, batch count)
};

struct ModelSummary {
  std::string name;
  std::filesystem::path model;  // -m, if given
  ModelConfig config;
  std::vector<ComponentSummary> components;  // transformer, text encoder, VAE
  std::optional<TokenizerSource> tokenizer;  // where it comes from; absent when none...
  std::string tokenizer_problem;             // ...and then why
  TensorCounts total;
};

// Summarises a model opened from its original files.
ModelSummary summarize(const SourceStore& store);

// Opens the model at `paths` (every check of open_model applies) and summarises it.
ModelSummary describe_model(const ModelPaths& paths);

// Stable keys for machine-readable output: "transformer", "text_encoder", "vae".
const char* component_key(Component c);

nlohmann::json to_json(const ModelSummary& s);

}  // namespace klein
