#pragma once
// A quick look at a generation while it denoises: the model's current estimate of the clean
// latents, x0 = x − σ·v, mapped to colour by a fixed linear map per latent channel, without
// the VAE. One pixel per 8x8 pixels of the image (each latent token covers 16x16 and holds
// 2x2 sub-positions of 32 channels), so a 1024x1024 generation previews at 128x128.
// The map is the published latent-to-RGB fit of the FLUX.2 VAE's latent space; on other
// weights (the random-weight test models) it shows structure, not the picture.
#include "core/grid.h"
#include "core/tensor.h"
#include "formats/image/image.h"

namespace klein {

// tokens: [rows·cols, 128] packed latents in the transformer's (normalised) space.
// RGB = clamp((F·z + b + 1) / 2) for each 32-channel sub-position z.
Image latent_preview(const Tensor& tokens, LatentGrid grid);

// The clean estimate x0 = x_in − σ·v of one step, as latent_preview shows it.
Image step_preview(const Tensor& latents_in, const Tensor& velocity, float sigma,
                   LatentGrid grid);

// Z-Image's latents [16, h, w] (the FLUX.1 VAE's channels, scaled as the transformer sees
// them): one pixel per latent position (8x8 pixels of the image), by the published fit of that
// VAE's latent space; and the clean estimate of one step.
Image flux1_latent_preview(const Tensor& latents);
Image flux1_step_preview(const Tensor& latents_in, const Tensor& velocity, float sigma);

}  // namespace klein
