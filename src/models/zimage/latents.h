#pragma once
// Z-Image's latents and the FLUX.1 16-channel VAE (diffusers AutoencoderKL, no quant convs):
// the pipeline's latents are scaled for the transformer, and the decoder's input is
//   z = latents / scaling_factor + shift_factor          (float32, as the pipeline does)
// with the factors of the VAE's config.json (Z-Image-Turbo: 0.3611 and 0.1159).
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/tensor.h"

namespace klein::zimage {

struct LatentScale {
  float scaling = 0.3611f;
  float shift = 0.1159f;
};

// scaling_factor and shift_factor of the VAE's config.json; both are required.
LatentScale parse_latent_scale(const nlohmann::json& j, const std::string& where);

// The VAE decoder's input for the pipeline's final latents.
Tensor decoder_input(const Tensor& latents, const LatentScale& scale);
// The inverse, for an encoded image: the VAE encoder's mean z → the pipeline's latents
// (z - shift_factor) * scaling_factor, as diffusers' image-to-image pipelines scale theirs.
Tensor latents_from_encoder(const Tensor& z, const LatentScale& scale);

}  // namespace klein::zimage
