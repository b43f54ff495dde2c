#pragma once
// The tiny autoencoders of madebyollin/taesd (taesd.py's Encoder and Decoder): a distilled
// stand-in for a diffusion model's VAE, 64 channels wide throughout, ReLU and 3x3
// convolutions only (plus, in FLUX.2's variant, a GroupNorm "pool" in the blocks at the
// latent resolution). TAEF2 (32 latent channels, with the pools) stands in for the FLUX.2
// VAE; TAEF1 (16, without) for the FLUX.1 VAE that Z-Image uses.
//
// Scale conventions (taesd.py and the ComfyUI/diffusers use of these weights): images are in
// [0, 1] (the full VAEs': [-1, 1]); the latents are those of the VAE the network was distilled
// from as its pipeline hands them to the decoder with a scaling factor of 1:
//   TAEF2: the FLUX.2 VAE's own latent [32, H/8, W/8] (the full decoder's input, after the
//          batch-norm statistics are undone and the 2x2 patches unpacked);
//   TAEF1: the FLUX.1 VAE's latent scaled for the transformer, (z - 0.1159) * 0.3611, i.e.
//          Z-Image's latents [16, H/8, W/8] as the sampler leaves them.
// (taesd.py's scale_latents / unscale_latents map latents to [0, 1] for storing them as
// 8-bit images; nothing here uses them.)
//
// Weights come from the published .pth files (formats/pth.h) or a .safetensors copy, with
// the tensor names of taesd.py's nn.Sequential ("3.conv.0.weight"), bare or under ComfyUI's
// "taesd_decoder." / "taesd_encoder." (or "decoder." / "encoder.") prefix. They are small
// (1.2 M values per half) and held as float32 for the object's life.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "ops/conv2d.h"

namespace klein::taesd {

// Receives every layer's output, named "decoder.<i>" / "encoder.<i>" after its index in
// taesd.py's nn.Sequential (layers fused into the one before or after are not reported: the
// decoder's ReLU 2 is reported as 2, its conv 1 not; an Upsample is fused into the conv
// after it).
using Observer = std::function<void(const std::string& name, const Tensor& value)>;

// Channels of the latents each published network works in.
constexpr int64_t kTaef2LatentChannels = 32;
constexpr int64_t kTaef1LatentChannels = 16;
// What a network of `latent_channels` is called ("TAEF2 (FLUX.2's VAE)").
std::string describe_latent_width(int64_t latent_channels);

// One half's tensors, float32, by the name inside the half ("3.conv.0.weight").
struct TinyWeights {
  std::filesystem::path path;
  std::map<std::string, std::pair<Shape, std::vector<float>>> tensors;
};
enum class Half { Encoder, Decoder };
// Reads the half from a .pth or .safetensors file (told apart by their first bytes).
TinyWeights read_tiny_weights(const std::filesystem::path& path, Half half);

// The decoder: latents [C, h, w] -> image [3, 8h, 8w] in about [0, 1], not clamped.
//
//   Clamp: 3 tanh(z / 3)                                  [C,  h,  w ]   0
//   conv 3x3 (C -> 64), ReLU                              [64, h,  w ]   1, 2
//   3 Blocks (with GroupNorm pools in TAEF2)              [64, h,  w ]   3-5
//   nearest x2, conv 3x3 (no bias), 3 Blocks              [64, 2h, 2w]   6-10
//   nearest x2, conv 3x3 (no bias), 3 Blocks              [64, 4h, 4w]   11-15
//   nearest x2, conv 3x3 (no bias), 1 Block               [64, 8h, 8w]   16-18
//   conv 3x3 (64 -> 3)                                    [3,  8h, 8w]   19
//
// Block(x): x += pool(x) when it has one (1x1 conv 64 -> 256, GroupNorm(4 groups, eps 1e-5),
// ReLU, 1x1 conv 256 -> 64, no biases), then ReLU(conv(ReLU(conv(ReLU(conv(x))))) + x).
class TinyDecoder {
 public:
  // `expected_latent_channels` (0: any): the width the caller's latents have; a network of
  // another width is refused naming the file, both widths and `use` (what it is for).
  explicit TinyDecoder(const std::filesystem::path& path, int64_t expected_latent_channels = 0,
                       const std::string& use = "");
  explicit TinyDecoder(TinyWeights weights, int64_t expected_latent_channels = 0,
                       const std::string& use = "");

  int64_t latent_channels() const { return latent_channels_; }
  bool mid_block_norm() const { return mid_block_norm_; }
  const std::filesystem::path& path() const { return path_; }

  // With band_rows > 0, layers 12-19 run on horizontal bands of the [64, 2h, 2w] plane,
  // band_rows rows of it a band read with 7 rows of halo on each inner side, each output row
  // with the whole plane's bits; the observer then sees layers up to 10 and the image (19).
  // Bands hold the last stage's buffers at about 4 (band_rows + 14) rows of [64, 8w] instead
  // of the whole [64, 8h, 8w] (256 MiB each at 1024x1024), for the halos' arithmetic.
  Tensor decode(const Tensor& latents, Compute& cx, const Observer& observe = {},
                int64_t band_rows = 0) const;
  // The band rows for latents [C, h, w] under the full VAE's memory rule (vae::VaeMemory):
  // 0 (whole planes) while the last stage's two planes fit `whole_limit`, else bands whose
  // buffers hold about `band_bytes`.
  static int64_t band_rows_for(int64_t h, int64_t w, uint64_t whole_limit, uint64_t band_bytes);

 private:
  std::filesystem::path path_;
  int64_t latent_channels_ = 0;
  bool mid_block_norm_ = false;
  std::map<std::string, ops::Conv2dWeights> convs_;
  std::map<std::string, std::vector<float>> norms_;
};

// The encoder: image [3, H, W] in [0, 1], H and W multiples of 8 -> latents [C, H/8, W/8].
//
//   conv 3x3 (3 -> 64), 1 Block                           [64, H,   W  ]   0, 1
//   conv 3x3 stride 2 (no bias), 3 Blocks                 [64, H/2, W/2]   2-5
//   conv 3x3 stride 2 (no bias), 3 Blocks                 [64, H/4, W/4]   6-9
//   conv 3x3 stride 2 (no bias), 3 Blocks (pools: TAEF2)  [64, H/8, W/8]   10-13
//   conv 3x3 (64 -> C)                                    [C,  H/8, W/8]   14
class TinyEncoder {
 public:
  explicit TinyEncoder(const std::filesystem::path& path, int64_t expected_latent_channels = 0,
                       const std::string& use = "");
  explicit TinyEncoder(TinyWeights weights, int64_t expected_latent_channels = 0,
                       const std::string& use = "");

  int64_t latent_channels() const { return latent_channels_; }
  bool mid_block_norm() const { return mid_block_norm_; }
  const std::filesystem::path& path() const { return path_; }

  Tensor encode(const Tensor& image, Compute& cx, const Observer& observe = {}) const;

 private:
  std::filesystem::path path_;
  int64_t latent_channels_ = 0;
  bool mid_block_norm_ = false;
  std::map<std::string, ops::Conv2dWeights> convs_;
  std::map<std::string, std::vector<float>> norms_;
};

}  // namespace klein::taesd
