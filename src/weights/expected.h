#pragma once
// What a FLUX.2-klein checkpoint must contain: every tensor's canonical name and shape as a
// function of the configuration (spec section b), and the configuration read back from
// tensor shapes (for single-file checkpoints that carry no config.json).
#include <charconv>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include "core/error.h"
#include "core/tensor.h"
#include "weights/config.h"
#include "weights/naming.h"

namespace klein {

using ShapeMap = std::map<std::string, Shape>;  // canonical name -> shape

ShapeMap expected_transformer(const TransformerConfig& c);
// Only the parts inference reads: the embedding and layers 0 .. layers_needed()-1.
ShapeMap expected_text_encoder(const TextEncoderConfig& c);
ShapeMap expected_vae(const VaeConfig& c);

TransformerConfig infer_transformer_config(const ShapeMap& tensors, const std::string& where);
// output_layers is left at its default: the family decides it (family.h), then the caller
// checks that the encoder has that many layers.
// head_dim: the head width when the tensors do not show it (no q_norm, as in Mistral; 128 is
// FLUX.2-dev's Mistral-Small-3.1). A Mistral model also gets Mistral Small 3.1's RoPE base
// (1e9) and RMSNorm epsilon (1e-5), which no weight shows either.
TextEncoderConfig infer_text_encoder_config(const ShapeMap& tensors, const std::string& where,
                                            int64_t head_dim = 128);
VaeConfig infer_vae_config(const ShapeMap& tensors, const std::string& where);

// The number of distinct indices i among the names "<prefix><i>.<rest>" (blocks, layers):
// how many a checkpoint without a config file has. An index too large for a count is refused
// naming the tensor. Inline: the families' checkpoint libraries (models/*/checkpoint), which
// this library links, use it too.
inline int64_t count_indexed(const ShapeMap& m, const std::string& prefix,
                             const std::string& where) {
  // Far above any model's blocks or layers, and a count that cannot overflow what uses it.
  constexpr uint64_t kLargest = 1'000'000;
  std::set<uint64_t> seen;
  for (const auto& [name, shape] : m) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t dot = name.find('.', prefix.size());
    const std::string_view num =
        std::string_view(name).substr(prefix.size(), dot == std::string::npos
                                                         ? std::string::npos
                                                         : dot - prefix.size());
    if (num.empty() || num.find_first_not_of("0123456789") != std::string_view::npos) continue;
    uint64_t i = 0;
    const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), i);
    check(ec == std::errc() && end == num.data() + num.size() && i <= kLargest, where,
          ": tensor ", name, " has the index ", num, " where at most ", kLargest,
          " is expected (", prefix, "<index>.)");
    seen.insert(i);
  }
  return int64_t(seen.size());
}

// Every expected tensor present with its shape; errors name the file, the tensor, and both
// shapes. Tensors the checkpoint has beyond those are allowed (unused Qwen3 layers, lm_head).
void check_tensors(const ShapeMap& expected, const ShapeMap& actual, Component c,
                   const std::string& where);

}  // namespace klein
