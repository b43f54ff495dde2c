#pragma once
#include "models/vae/blocks.h"

namespace klein::vae {

// The VAE encoder (Encoder + quant_conv): pixels [in_channels, H, W] in [-1, 1] → moments
// [2·latent_channels, H/8, W/8]; channels [0, latent) are the posterior mean, the rest the
// log-variance. `weights` is the "vae.encoder" unit. H and W must be multiples of 8 (the
// caller checks the pipeline's multiple of 16). Reports encoder_down_blocks_{i},
// encoder_mid_block, encoder_conv_out, quant_conv. Large images run banded down to the
// deepest level, with tensors in scratch files (VaeMemory, bands.h): the same result.
Tensor run_encoder(const WeightUnit& weights, const VaeConfig& config, const Tensor& pixels,
                   Compute& cx, const Observer& observe = {}, const VaeMemory& memory = {});

}  // namespace klein::vae
