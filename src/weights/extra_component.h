#pragma once
// A network stored in a container beside the model: the safety classifier (klein convert
// --safety-model), a control model (--controlnet) or the tiny autoencoder's decoder
// (--tiny-vae). Its tensors' canonical names and its
// units' names start with `key` + "."; the container's metadata object `key` holds what
// reopening it needs (its configuration, where it came from). Convert writes its units under
// the same policy as the model's, after them, and carries it over from a container source
// unless a new one replaces it.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

struct ExtraComponent {
  std::string key;                     // one of kExtraComponentKeys
  std::string title;                   // "the safety classifier", for messages
  std::shared_ptr<WeightStore> store;  // its units, from its own files (mapped or read)
  nlohmann::json metadata;             // the container's metadata[key]
};

// The keys of every such network a container may hold.
inline constexpr const char* kExtraComponentKeys[] = {"safety", "controlnet", "tiny_vae"};

// Whether a unit or canonical tensor name belongs to the extra component `key`.
inline bool in_extra_component(const std::string& name, const std::string& key) {
  return name.size() > key.size() && name.compare(0, key.size(), key) == 0 &&
         name[key.size()] == '.';
}

// The key of the extra component a unit or canonical tensor name belongs to; "" for the model's
// own (transformer, text encoder, VAE).
inline std::string extra_component_key(const std::string& name) {
  for (const char* key : kExtraComponentKeys)
    if (in_extra_component(name, key)) return key;
  return "";
}

// The tiny autoencoder's decoder (pipeline/tiny_decoder.h): one unit, its tensors under
// taesd.py's names ("3.conv.0.weight") after the unit's prefix.
inline constexpr const char* kTinyVaeDecoderUnit = "tiny_vae.decoder";
inline std::optional<UnitOf> tiny_vae_unit_of(const std::string& canonical) {
  const std::string prefix = std::string(kTinyVaeDecoderUnit) + ".";
  if (canonical.size() <= prefix.size() || canonical.compare(0, prefix.size(), prefix) != 0)
    return std::nullopt;
  return UnitOf{kTinyVaeDecoderUnit, prefix};
}

}  // namespace klein
