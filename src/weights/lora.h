#pragma once
// LoRA adapters of the transformer: low-rank updates W' = W + s·B·A of its linear weights,
// read from the files trainers publish. At run time they are applied beside the weights
// (y = W·x + s·B·(A·x), ops/low_rank.h), so the container's quantized bytes never change;
// `klein convert --lora` merges them before quantization instead.
//
// A module M of a file holds M.lora_A.weight [r, in] and M.lora_B.weight [out, r]
// ("lora_down"/"lora_up" are the same), optionally M.alpha (a scalar: the update is scaled by
// alpha / r; without it by 1). Which weights a module changes is the model family's
// (ModelFamily::lora_targets): FLUX.2-klein reads the diffusers/PEFT, BFL / ai-toolkit and
// kohya spellings (weights/lora_names.cpp), Z-Image the diffusers/PEFT, original (ComfyUI,
// musubi-tuner) and kohya ones (families/zimage/checkpoint.cpp); a fused projection's
// B is split by rows among the weights it becomes.
// Anything else (text-encoder LoRAs, DoRA magnitudes, biases, full weight differences, a
// module of another family's transformer) is refused with the tensor's name: an adapter
// half-applied would be a silently wrong image.
#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "weights/config.h"

namespace klein {

// One --lora argument: FILE or FILE:SCALE (the user's multiplier, default 1).
struct LoraFile {
  std::filesystem::path path;
  float scale = 1.0f;
};
// Parses FILE[:SCALE]; a suffix after the last ':' that is not a number is part of the path.
LoraFile parse_lora_argument(const std::string& text);
// "name:scale" for metadata and messages.
std::string lora_label(const LoraFile& f);

// One low-rank update: `target` += scale · up · down.
struct LoraUpdate {
  std::string target;  // canonical weight name, e.g. "transformer.transformer_blocks.0.attn.to_q.weight"
  Tensor down;         // [r, columns of target]
  Tensor up;           // [rows of target, r]
  float scale = 1.0f;  // alpha / r times the user's scale
};

class Adapters {
 public:
  // Reads every file, maps each module to the transformer's weights (by the model's family)
  // and checks every shape against the configuration. Errors name the file and the tensor.
  static Adapters load(std::span<const LoraFile> files, const ModelConfig& config);

  bool empty() const { return updates_.empty(); }
  // The updates of one weight, in file order (empty when it has none).
  std::span<const LoraUpdate> on(const std::string& target) const;
  // Every weight with updates.
  const std::map<std::string, std::vector<LoraUpdate>>& all() const { return updates_; }
  // Bytes held (float32 A and B; a fused QKV's A once per part).
  size_t bytes() const;

 private:
  std::map<std::string, std::vector<LoraUpdate>> updates_;
};

}  // namespace klein
