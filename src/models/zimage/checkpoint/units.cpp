#include "models/zimage/checkpoint/units.h"

#include <regex>

namespace klein::zimage {

std::string noise_refiner_unit(int64_t i) {
  return "transformer.noise_refiner." + std::to_string(i);
}
std::string context_refiner_unit(int64_t i) {
  return "transformer.context_refiner." + std::to_string(i);
}
std::string layer_unit(int64_t i) { return "transformer.layer." + std::to_string(i); }

std::optional<UnitOf> transformer_unit_of(const std::string& canonical) {
  static const std::regex block(
      R"(^transformer\.(noise_refiner|context_refiner|layers)\.(\d+)\..+$)");
  static const std::regex shared(
      R"(^transformer\.(all_x_embedder\.|all_final_layer\.|cap_embedder\.|t_embedder\.|x_pad_token$|cap_pad_token$).*$)");
  std::smatch m;
  if (std::regex_match(canonical, m, block)) {
    const std::string kind = m[1].str(), index = m[2].str();
    const std::string unit = kind == "layers" ? "layer" : kind;
    return UnitOf{"transformer." + unit + "." + index, "transformer." + kind + "." + index + "."};
  }
  if (std::regex_match(canonical, shared)) return UnitOf{"transformer.shared", "transformer."};
  return std::nullopt;
}

void add_block_shapes(ShapeMap& m, const std::string& p, const TransformerConfig& c,
                      bool modulated) {
  const int64_t D = c.dim, F = c.ffn_hidden(), A = c.adaln_dim(), hd = c.head_dim();
  for (const char* n : {"to_q", "to_k", "to_v"}) m[p + "attention." + n + ".weight"] = {D, D};
  m[p + "attention.to_out.0.weight"] = {D, D};
  m[p + "attention.norm_q.weight"] = {hd};
  m[p + "attention.norm_k.weight"] = {hd};
  for (const char* n : {"attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"})
    m[p + n + ".weight"] = {D};
  m[p + "feed_forward.w1.weight"] = {F, D};
  m[p + "feed_forward.w3.weight"] = {F, D};
  m[p + "feed_forward.w2.weight"] = {D, F};
  if (modulated) {
    m[p + "adaLN_modulation.0.weight"] = {4 * D, A};
    m[p + "adaLN_modulation.0.bias"] = {4 * D};
  }
}

ShapeMap expected_transformer(const TransformerConfig& c) {
  const int64_t D = c.dim, A = c.adaln_dim();
  const int64_t P = c.patch_features();
  const std::string key = std::to_string(c.patch) + "-" + std::to_string(c.frame_patch);
  ShapeMap m;
  const std::string t = "transformer.";
  m[t + "all_x_embedder." + key + ".weight"] = {D, P};
  m[t + "all_x_embedder." + key + ".bias"] = {D};
  m[t + "all_final_layer." + key + ".adaLN_modulation.1.weight"] = {D, A};
  m[t + "all_final_layer." + key + ".adaLN_modulation.1.bias"] = {D};
  m[t + "all_final_layer." + key + ".linear.weight"] = {P, D};
  m[t + "all_final_layer." + key + ".linear.bias"] = {P};
  m[t + "cap_embedder.0.weight"] = {c.cap_feat_dim};
  m[t + "cap_embedder.1.weight"] = {D, c.cap_feat_dim};
  m[t + "cap_embedder.1.bias"] = {D};
  m[t + "t_embedder.mlp.0.weight"] = {1024, 256};
  m[t + "t_embedder.mlp.0.bias"] = {1024};
  m[t + "t_embedder.mlp.2.weight"] = {A, 1024};
  m[t + "t_embedder.mlp.2.bias"] = {A};
  m[t + "x_pad_token"] = {1, D};
  m[t + "cap_pad_token"] = {1, D};
  for (int64_t i = 0; i < c.n_refiner_layers; ++i) {
    add_block_shapes(m, t + "noise_refiner." + std::to_string(i) + ".", c, true);
    add_block_shapes(m, t + "context_refiner." + std::to_string(i) + ".", c, false);
  }
  for (int64_t i = 0; i < c.n_layers; ++i)
    add_block_shapes(m, t + "layers." + std::to_string(i) + ".", c, true);
  return m;
}

}  // namespace klein::zimage
