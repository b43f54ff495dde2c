#pragma once
// LoRA adapters of the transformer: low-rank updates W' = W + s·B·A of its linear weights,
// read from the files trainers publish. At run time they are applied beside the weights
// (y = W·x + s·B·(A·x), ops/low_rank.h), so the container's quantized bytes never change;
// `klein convert --lora` merges them before quantization instead.
//
// A module M of a file holds M.lora_A.weight [r, in] and M.lora_B.weight [out, r]
// ("lora_down"/"lora_up" are the same), optionally M.alpha (a scalar: the update is scaled by
// alpha / r; without it by 1). Module spellings:
//   diffusers / PEFT   transformer.transformer_blocks.0.attn.to_q   ("transformer." and
//                      "base_model.model." optional)
//   BFL / ai-toolkit   diffusion_model.double_blocks.0.img_attn.qkv: the fused QKV becomes
//                      to_q, to_k and to_v (A shared, B in thirds); final_layer.adaLN_
//                      modulation.1 swaps B's halves as the weight does
//   kohya              lora_unet_double_blocks_0_img_attn_qkv (the BFL module, '_' for '.')
// Anything else (text-encoder LoRAs, DoRA magnitudes, biases, full weight differences) is
// refused with the tensor's name: an adapter half-applied would be a silently wrong image.
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
  // Reads every file, maps each module to the transformer's weights and checks every shape
  // against the configuration. Errors name the file and the tensor.
  static Adapters load(std::span<const LoraFile> files, const TransformerConfig& config);

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
