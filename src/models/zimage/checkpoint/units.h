#pragma once
// How the Z-Image transformer's tensors are grouped into weight-store units, and the tensors
// a checkpoint must hold. Canonical names are diffusers' with the prefix "transformer.".
//
//   transformer.shared               prefix "transformer."   all_x_embedder.2-1.*,
//                                    all_final_layer.2-1.*, cap_embedder.*, t_embedder.*,
//                                    x_pad_token, cap_pad_token
//   transformer.noise_refiner.{i}    prefix "transformer.noise_refiner.{i}."
//   transformer.context_refiner.{i}  prefix "transformer.context_refiner.{i}."
//   transformer.layer.{i}            prefix "transformer.layers.{i}."
#include <optional>
#include <string>

#include "models/zimage/checkpoint/config.h"
#include "weights/expected.h"
#include "weights/naming.h"

namespace klein::zimage {

std::string noise_refiner_unit(int64_t i);
std::string context_refiner_unit(int64_t i);
std::string layer_unit(int64_t i);

// The unit of a canonical transformer tensor; nothing for names outside the layout above.
std::optional<UnitOf> transformer_unit_of(const std::string& canonical);

// The tensors of one block (prefix `p`, e.g. "transformer.layers.3."), with its modulation
// when `modulated`.
void add_block_shapes(ShapeMap& m, const std::string& p, const TransformerConfig& c,
                      bool modulated);

// Every tensor of the transformer with its shape (canonical names).
ShapeMap expected_transformer(const TransformerConfig& c);

}  // namespace klein::zimage
