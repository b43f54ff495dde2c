#pragma once
// Finding and opening a model. A model is given as
//   -m DIR        the diffusers directory of FLUX.2-klein (model_index.json, transformer/,
//                 text_encoder/, vae/, tokenizer/, scheduler/), or a klein container file;
//   or single files: --diffusion-model FILE (BFL/ComfyUI or diffusers transformer safetensors),
//                 --text-encoder FILE (Qwen3 safetensors or index.json), --vae FILE,
//                 --tokenizer DIR (vocab.json + merges.txt + tokenizer_config.json, or
//                 tokenizer.json).
// Either way the result is one WeightStore with canonical names and a checked ModelConfig.
//
// The tokenizer comes from one place, chosen by one rule (tokenizer_source), whichever of
// these options are given together:
//   1. --tokenizer DIR, when given;
//   2. else the klein container given with -m (it stores the tokenizer it was converted with);
//   3. else a llama.cpp GGUF --text-encoder that carries its tokenizer (tokenizer.ggml.model
//      in its metadata), even when -m DIR has a tokenizer/ too: the tokenizer travels with
//      the text encoder whose vocabulary it indexes;
//   4. else the tokenizer/ of the -m diffusers directory.
// Single safetensors files carry no tokenizer: with them, give --tokenizer DIR or -m DIR.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "weights/weight_store.h"

namespace klein {

struct ModelPaths {
  std::filesystem::path model;            // -m: diffusers directory or klein container
  std::filesystem::path diffusion_model;  // single-file overrides
  std::filesystem::path text_encoder;
  std::filesystem::path vae;
  std::filesystem::path tokenizer;        // directory
  // --variant: 4b, 4b-base, 9b, 9b-base or 9b-kv, for checkpoints that do not say (single
  // files have no model_index.json). Sets distilled/base and the K/V pipeline; where the
  // checkpoint does say, it must agree. Empty: what the checkpoint says, else distilled.
  std::string variant;
};

// The variant names --variant accepts, of every family.
const std::vector<std::string>& variant_names();

class SourceStore;

// Opens the model (validating every file and the pairing of the components): a klein
// container, or a store that reads straight from the original safetensors (exact).
std::unique_ptr<WeightStore> open_model(const ModelPaths& paths);
// The original checkpoint only (not a container), with its components' files and names, for
// the tools that describe a checkpoint.
std::unique_ptr<SourceStore> open_source_model(const ModelPaths& paths);
// The text encoder alone, for prompt upsampling: from -m DIR's text_encoder/ or
// --text-encoder FILE, its configuration and tensors checked as open_model checks them; the
// transformer and the VAE are neither required nor read (so no pairing check), and
// --diffusion-model and --vae are ignored. A klein container is opened whole (open_model).
std::unique_ptr<WeightStore> open_text_encoder_model(const ModelPaths& paths);
inline std::unique_ptr<WeightStore> open_model(const std::filesystem::path& model) {
  ModelPaths p;
  p.model = model;
  return open_model(p);
}

// Where a model's tokenizer comes from (the rule above).
class SafetensorsSet;

struct TokenizerSource {
  enum class Kind {
    Directory,  // vocab.json + merges.txt (+ tokenizer_config.json), tokenizer.json, or
                // Mistral's tekken.json
    Gguf,       // the metadata of a llama.cpp text-encoder GGUF (tokenizer.ggml.*)
    Container,  // the tokenizer files stored in a klein container
    Tekken,     // a single-file text encoder's "tekken_model" tensor (tokenizer/tekken.h)
  };
  Kind kind = Kind::Directory;
  std::filesystem::path path;  // the directory, the GGUF file, the container or the text encoder
  // Tekken: the text encoder's files as opened to find the tensor, so that reading the
  // tokenizer parses their headers no second time.
  std::shared_ptr<const SafetensorsSet> tekken_files;
};

// "directory", "gguf", "container" or "tekken", for messages and machine-readable output.
const char* tokenizer_kind_name(TokenizerSource::Kind kind);

// Whether DIR holds tokenizer files of one of the Directory forms (vocab.json, tokenizer.json
// or tekken.json); false where DIR does not exist.
bool holds_tokenizer(const std::filesystem::path& dir);

// Applies the rule above. Checks what it can without reading the tokenizer: a directory holds
// vocab.json or tokenizer.json; otherwise throws naming the option or file that lacks a
// tokenizer and what to give instead.
TokenizerSource tokenizer_source(const ModelPaths& paths);

}  // namespace klein
