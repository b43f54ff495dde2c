#pragma once
#include "models/vae/blocks.h"

namespace klein::vae {

// The VAE decoder (post_quant_conv + Decoder): latent z [latent_channels, H/8, W/8] → image
// [out_channels, H, W], roughly in [-1, 1] and not clamped. `weights` is the "vae.decoder"
// unit. Reports post_quant_conv, decoder_conv_in, decoder_mid_block, decoder_up_blocks_{i},
// decoder_conv_out. Large images run banded, with tensors in scratch files (VaeMemory).
Tensor run_decoder(const WeightUnit& weights, const VaeConfig& config, const Tensor& z, Compute& cx,
                   const Observer& observe = {}, const VaeMemory& memory = {});

}  // namespace klein::vae
