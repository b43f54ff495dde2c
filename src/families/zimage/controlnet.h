#pragma once
// A Z-Image control model (alibaba-pai's Z-Image-Turbo-Fun-Controlnet-Union, diffusers'
// ZImageControlNetModel) opened for a generation: `--controlnet PATH` is
//   a diffusers directory      config.json + diffusion_pytorch_model.safetensors (or its index)
//   the original single file   Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors as published:
//                              the diffusers names already (diffusers' single-file loader maps
//                              them unchanged); the file records no places, so they are the
//                              2.1 release's rule: control layer j after main layer 2j, control
//                              refiner block j after noise-refiner layer j, control_in_dim from
//                              the embedder's width
// Every tensor is checked against the configuration (present, a float type, its shape, nothing
// else) before a pixel is read; the versions the engine does not run (Union 1.0, 2.0) and
// control models of another transformer are refused by name.
// A container may hold the control model beside the model (klein convert --controlnet): its
// units among the model's, quantized by the policy, its configuration in the metadata's
// "controlnet" object; a generation with a control image and no --controlnet takes it.
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/zimage/checkpoint/config.h"
#include "models/zimage/checkpoint/controlnet.h"
#include "weights/extra_component.h"
#include "weights/weight_store.h"

namespace klein::zimage {

struct ControlModel {
  // The units of checkpoint/controlnet.h: a store of its own files, or the model's container
  // (not owned: the session's store).
  std::shared_ptr<WeightStore> store;
  std::vector<std::string> units;  // its units in `store`
  ControlNetConfig config;
  nlohmann::json config_json;  // the configuration it was read with (a container stores it)
  std::filesystem::path path;  // as given, for messages
};

ControlModel open_control_model(const std::filesystem::path& path, const TransformerConfig& base);

// The control model the container behind `weights` holds (its units in that store, which must
// outlive the result), checked against the metadata's configuration and `base`; nothing when
// the model holds none.
std::optional<ControlModel> stored_control_model(WeightStore& weights, const TransformerConfig& base);

// The control model as a network to store beside the model (convert --controlnet).
ExtraComponent control_component(ControlModel model);

}  // namespace klein::zimage
