#pragma once
// Finding and opening a model. A model is given as
//   -m DIR        the diffusers directory of FLUX.2-klein (model_index.json, transformer/,
//                 text_encoder/, vae/, tokenizer/, scheduler/), or a klein container file;
//   or single files: --diffusion-model FILE (BFL/ComfyUI or diffusers transformer safetensors),
//                 --text-encoder FILE (Qwen3 safetensors or index.json), --vae FILE,
//                 --tokenizer DIR (vocab.json + merges.txt + tokenizer_config.json, or
//                 tokenizer.json).
// Either way the result is one WeightStore with canonical names and a checked ModelConfig.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "weights/weight_store.h"

namespace klein {

struct ModelPaths {
  std::filesystem::path model;            // -m: diffusers directory (or container, later)
  std::filesystem::path diffusion_model;  // single-file overrides
  std::filesystem::path text_encoder;
  std::filesystem::path vae;
  std::filesystem::path tokenizer;        // directory
  // --variant: 4b, 4b-base, 9b, 9b-base or 9b-kv, for checkpoints that do not say (single
  // files have no model_index.json). Sets distilled/base and the K/V pipeline; where the
  // checkpoint does say, it must agree. Empty: what the checkpoint says, else distilled.
  std::string variant;
};

// The variant names --variant accepts.
const std::vector<std::string>& variant_names();

class SourceStore;

// Opens the model (validating every file and the pairing of the components): a klein
// container, or a store that reads straight from the original safetensors (exact).
std::unique_ptr<WeightStore> open_model(const ModelPaths& paths);
// The original checkpoint only (not a container), with its components' files and names, for
// the tools that describe a checkpoint.
std::unique_ptr<SourceStore> open_source_model(const ModelPaths& paths);
inline std::unique_ptr<WeightStore> open_model(const std::filesystem::path& model) {
  ModelPaths p;
  p.model = model;
  return open_model(p);
}

// The tokenizer directory of a model given as paths (tokenizer/ of a diffusers directory,
// or --tokenizer). Throws naming what is missing.
std::filesystem::path find_tokenizer_dir(const ModelPaths& paths);

}  // namespace klein
