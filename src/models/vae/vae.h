#pragma once
// The FLUX.2 VAE as the klein pipeline uses it (diffusers AutoencoderKLFlux2 + the pipeline's
// latent glue):
//
//   decode: tokens [h·w, 128] → unpack [128, h, w] → denormalize → unpatchify [32, 2h, 2w]
//           → decoder → image [3, 16h, 16w]
//   encode: image [3, H, W] in [-1, 1] → encoder → posterior mean [32, H/8, W/8] → patchify
//           [128, H/16, W/16] → normalize → pack → tokens [H/16·W/16, 128]
//
// Each step is public so the pipeline can stop in between (e.g. to dump vae_input.npy), and an
// Observer sees every named intermediate. Weights are read from the store when a call runs
// ("vae.decoder", "vae.encoder", held only during that call) and converted to float32 one
// layer at a time. Memory is bounded by a few activation tensors (see decoder.cpp).
#include "models/vae/blocks.h"
#include "models/vae/latents.h"

namespace klein::vae {

class Vae {
 public:
  // Reads the latent statistics ("vae.latent_stats") now, when the VAE has them (FLUX.2's;
  // with FLUX.1's only decode_latent and encode_mean apply); everything else per call.
  // The convolutions' arithmetic is the context's (Compute::arithmetic) when a call runs.
  Vae(WeightStore& store, Compute& cx, VaeMemory memory = {});

  const VaeConfig& config() const { return store_.config().vae; }
  const LatentStats& latent_stats() const { return stats_; }
  // Pixels per token along each side (16) and per latent position (8).
  int64_t pixels_per_token() const;
  int64_t pixels_per_latent() const;

  // tokens [h·w, 128] (the transformer's packed latents) → image [3, H, W] with H = 16h,
  // W = 16w, roughly in [-1, 1], not clamped. Reports unpacked, denormalized, unpatchified,
  // the decoder's intermediates (decoder.h) and image.
  Tensor decode(const Tensor& tokens, int64_t h, int64_t w, const Observer& observe = {}) const;
  // The first three steps: tokens → the decoder's input [32, 2h, 2w] (vae_input).
  Tensor tokens_to_latent(const Tensor& tokens, int64_t h, int64_t w,
                          const Observer& observe = {}) const;
  // The decoder alone (vae.decode): z [32, H/8, W/8] → image [3, H, W].
  Tensor decode_latent(const Tensor& z, const Observer& observe = {}) const;

  // A reference image [3, H, W] in [-1, 1], H and W multiples of 16 → normalized tokens
  // [H/16·W/16, 128]. Reports the encoder's intermediates (encoder.h), vae_mean, patchified,
  // normalized and tokens.
  Tensor encode(const Tensor& pixels, const Observer& observe = {}) const;
  // The encoder alone, keeping the posterior mean: [32, H/8, W/8].
  Tensor encode_mean(const Tensor& pixels, const Observer& observe = {}) const;
  // The encoder alone, the whole diagonal Gaussian posterior (diffusers'
  // DiagonalGaussianDistribution): the mean and std = exp(logvar / 2) with logvar clamped to
  // [-30, 20], each [latent_channels, H/8, W/8]. Reports vae_mean and vae_std.
  struct Posterior {
    Tensor mean, std;
  };
  Posterior encode_posterior(const Tensor& pixels, const Observer& observe = {}) const;
  // The remaining steps: mean → patchify → normalize → pack.
  Tensor latent_to_tokens(const Tensor& mean, const Observer& observe = {}) const;

 private:
  // The encoder's moments [2 · latent_channels, H/8, W/8] (mean, then logvar).
  Tensor encode_moments(const Tensor& pixels, const Observer& observe) const;

  WeightStore& store_;
  Compute& cx_;
  LatentStats stats_;
  VaeMemory memory_;
};

}  // namespace klein::vae

namespace klein::vae {

// What decoding to / encoding from an image of height x width pixels takes under `memory`
// (blocks.h), following decoder.cpp and encoder.cpp; for memory budgets before a run.
struct VaeMemoryEstimate {
  bool banded = false;  // runs in bands (the whole-image form would pass memory.whole_limit)
  // The activation memory: the largest set of float32 tensors and convolution scratch alive at
  // once, weights not included (for an encode, the input pixels the pipeline keeps included).
  size_t activation_bytes = 0;
  // Bytes of scratch files held at once (0 when it runs whole or in memory).
  uint64_t scratch_bytes = 0;
};
VaeMemoryEstimate decode_memory(const VaeConfig& config, int64_t height, int64_t width,
                                const VaeMemory& memory = {});
VaeMemoryEstimate encode_memory(const VaeConfig& config, int64_t height, int64_t width,
                                const VaeMemory& memory = {});
// Before a generation that encodes images of the sizes `encodes` ((height, width) pairs) and
// decodes one of height x width: when scratch files will be used, checks that they can be
// made in memory.dir() and that it has the room (core/plane.h); throws klein::Error otherwise.
void check_scratch(const VaeConfig& config, const std::vector<std::pair<int64_t, int64_t>>& encodes,
                   int64_t height, int64_t width, const VaeMemory& memory = {});

}  // namespace klein::vae
