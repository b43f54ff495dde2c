#pragma once
// The Z-Image ControlNet (diffusers ZImageControlNetModel; alibaba-pai's
// Z-Image-Turbo-Fun-Controlnet-Union): its hyper-parameters, how its tensors are grouped into
// weight-store units, and the tensors a checkpoint must hold. Canonical names are the
// checkpoint's (the diffusers layout and the original single file name them alike) with the
// prefix "controlnet.".
//
//   controlnet.shared         prefix "controlnet."                   control_all_x_embedder.2-1.*
//   controlnet.refiner.{j}    prefix "controlnet.control_noise_refiner.{j}."
//   controlnet.layer.{j}      prefix "controlnet.control_layers.{j}."
//
// Control block j (ZImageControlTransformerBlock) is a modulated Z-Image block with an
// after_proj (Linear D → D, the hint), and block 0 of each list a before_proj too.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "models/zimage/checkpoint/config.h"
#include "weights/expected.h"
#include "weights/naming.h"

namespace klein::zimage {

struct ControlNetConfig {
  // control_layers_places: control layer j's hint is added after main layer layer_places[j].
  std::vector<int64_t> layer_places;
  // control_refiner_layers_places: control refiner block j's hint is added to the control
  // model's own pass of the image rows after noise-refiner layer refiner_places[j].
  std::vector<int64_t> refiner_places;
  int64_t in_channels = 33;  // control_in_dim: 16 latent channels, padded with zeros (or the
                             // inpainting mode's mask and masked-image latents)
  int64_t dim = 3840;
  int64_t n_heads = 30;
  double norm_eps = 1e-5;
};

// Reads config.json against the transformer it controls; `where` names the file in errors.
// Only the Union 2.1 structure (add_control_noise_refiner "control_noise_refiner") is run:
// 1.0 (none) and 2.0 ("control_layers") are refused by name, as is a control model of
// another width, heads or patch size, or places outside the transformer.
ControlNetConfig parse_controlnet_config(const nlohmann::json& j, const std::string& where,
                                         const TransformerConfig& base);

std::string control_refiner_unit(int64_t j);
std::string control_layer_unit(int64_t j);

// The unit of a canonical control tensor; nothing for names outside the layout above.
std::optional<UnitOf> controlnet_unit_of(const std::string& canonical);

// Every tensor of the control model with its shape (canonical names).
ShapeMap expected_controlnet(const ControlNetConfig& c, const TransformerConfig& base);

}  // namespace klein::zimage
