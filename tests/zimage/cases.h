#pragma once
// The guidance settings of one official run of zimage-tiny (vectors/e2e/<case>/case.json),
// with the pipeline's defaults (cfg_normalization False, cfg_truncation 1.0) where the case
// does not set them.
#include <nlohmann/json.hpp>

#include "models/zimage/sampler.h"

namespace klein::zimage {

inline Guidance case_guidance(const nlohmann::json& info) {
  Guidance g;
  g.scale = info["guidance_scale"].get<float>();
  const nlohmann::json normalization = info.value("cfg_normalization", nlohmann::json(false));
  g.normalization = normalization.is_boolean() ? (normalization.get<bool>() ? 1.0f : 0.0f)
                                               : normalization.get<float>();
  g.truncation = info.value("cfg_truncation", 1.0f);
  return g;
}

}  // namespace klein::zimage
