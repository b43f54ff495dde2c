#include "models/zimage/latents.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_fields.h"

namespace klein::zimage {

LatentScale parse_latent_scale(const nlohmann::json& j, const std::string& where) {
  auto factor = [&](const char* key) {
    check(j.is_object() && j.contains(key) && j.at(key).is_number(), where, ": expected \"", key,
          "\", a number (Z-Image scales its latents by the VAE's factors)");
    float value = 0.0f;
    read_json_field(j, key, value, where);  // refuses a number outside float's range
    return value;
  };
  LatentScale s;
  s.scaling = factor("scaling_factor");
  s.shift = factor("shift_factor");
  check(s.scaling != 0.0f, where, ": scaling_factor must not be 0");
  return s;
}

Tensor decoder_input(const Tensor& latents, const LatentScale& scale) {
  Tensor z(latents.shape());
  for (int64_t i = 0; i < latents.numel(); ++i)
    z.data()[i] = latents.data()[i] / scale.scaling + scale.shift;
  return z;
}

Tensor latents_from_encoder(const Tensor& z, const LatentScale& scale) {
  Tensor latents(z.shape());
  for (int64_t i = 0; i < z.numel(); ++i)
    latents.data()[i] = (z.data()[i] - scale.shift) * scale.scaling;
  return latents;
}

}  // namespace klein::zimage
