#pragma once
// The glue between the VAE latent and the transformer's tokens, exactly as the klein pipeline
// does it (diffusers Flux2KleinPipeline _patchify_latents, _pack_latents, _unpack_latents_with_ids,
// and the BatchNorm statistics of the VAE):
//
//   VAE latent [32, 2h, 2w]  --patchify 2×2-->  [128, h, w]  --normalize-->  --pack-->  [h·w, 128]
//
// and the exact inverse on the way back. Patchify puts latent channel c, row offset dy and
// column offset dx at channel 4·c + 2·dy + dx; tokens are row-major over (row, column).
#include <array>
#include <vector>

#include "core/tensor.h"
#include "weights/weight_store.h"

namespace klein::vae {

// tokens [h·w, C] → [C, h, w]
Tensor unpack_tokens(const Tensor& tokens, int64_t h, int64_t w);
// [C, h, w] → tokens [h·w, C]
Tensor pack_tokens(const Tensor& latent);

// [c, ph·h, pw·w] → [c·ph·pw, h, w], channel (c·ph + dy)·pw + dx.
Tensor patchify(const Tensor& latent, std::array<int64_t, 2> patch);
// [c·ph·pw, h, w] → [c, ph·h, pw·w]
Tensor unpatchify(const Tensor& packed, std::array<int64_t, 2> patch);

// Per-channel statistics of the patchified latent: bn.running_mean and
// sqrt(bn.running_var + batch_norm_eps), used exactly as stored (no rounded copies).
struct LatentStats {
  std::vector<float> mean;
  std::vector<float> std;
};
// From the "vae.latent_stats" unit.
LatentStats load_latent_stats(const WeightUnit& unit, const VaeConfig& config);

// In place over [C, h, w]: (x - mean[c]) / std[c] (encode direction) and its inverse
// x · std[c] + mean[c] (decode direction).
void normalize_latent(Tensor& packed, const LatentStats& stats);
void denormalize_latent(Tensor& packed, const LatentStats& stats);

}  // namespace klein::vae
