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
#include <filesystem>
#include <memory>

#include "models/zimage/checkpoint/config.h"
#include "models/zimage/checkpoint/controlnet.h"
#include "weights/weight_store.h"

namespace klein::zimage {

struct ControlModel {
  std::unique_ptr<WeightStore> store;  // the units of checkpoint/controlnet.h
  ControlNetConfig config;
  std::filesystem::path path;  // as given, for messages
};

ControlModel open_control_model(const std::filesystem::path& path, const TransformerConfig& base);

}  // namespace klein::zimage
