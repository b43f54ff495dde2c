#pragma once
// Building blocks shared by the two halves of the FLUX.2 VAE (diffusers AutoencoderKLFlux2):
// weight loading, GroupNorm, the ResNet block and the mid block with its attention.
// Activations are [C, H, W] float32 tensors (batch 1).
#include <functional>
#include <string>

#include "core/plane.h"
#include "core/tensor.h"
#include "ops/compute.h"
#include "ops/conv2d.h"
#include "ops/group_norm.h"
#include "weights/weight_store.h"

namespace klein::vae {

// Receives named intermediate tensors (tests, --dump); names follow the golden files, e.g.
// "decoder_up_blocks_2", "vae_mean", "tokens". Empty: nothing is reported.
using Observer = std::function<void(const std::string& name, const Tensor& value)>;

// What every block needs: the weights of the half being run, its hyper-parameters, the
// compute context (whose arithmetic.fast_convolutions puts every convolution on AMX BF16
// tiles, or on the faster forms ops/conv2d.h lists for other CPUs: the decoder two to several
// times faster, the image moved by up to about 1e-2 of its range).
struct Net {
  const WeightUnit& weights;
  const VaeConfig& config;
  Compute& cx;
  const Observer& observe;

  void report(const std::string& name, const Tensor& value) const {
    if (observe) observe(name, value);
  }
};

// How the VAE holds its activations. When the whole-image decode's (or encode's) activations
// fit in `whole_limit`, every tensor is in memory and each layer runs over the whole image.
// Otherwise the decoder runs banded from up_blocks.0 on, and the encoder down to its deepest
// level (bands.h): each layer computes its output in bands of rows, reading the input rows of
// a band (with the one-row halo a 3x3 convolution needs), and each tensor larger than
// `plane_limit` lives in a scratch file (core/plane.h). GroupNorm statistics are summed over
// the stored tensor in the same order either way, and every output value comes from the same
// arithmetic, so the result is bit-identical to the whole-image one (tests/vae/vae_test.cpp).
struct VaeMemory {
  size_t whole_limit = size_t(512) << 20;
  size_t plane_limit = size_t(128) << 20;
  std::string scratch_dir;  // empty: default_scratch_dir()
  int64_t band_rows = 0;    // output rows per band; 0: about band_bytes of input and output
  size_t band_bytes = size_t(48) << 20;
  std::string dir() const { return scratch_dir.empty() ? default_scratch_dir() : scratch_dir; }
};

// Convolution `name` ("decoder.conv_in") as float32, checked to be [out, in, kernel, kernel]
// with a bias [out]. Converted when a layer runs and freed after it, one layer at a time.
ops::Conv2dWeights load_conv(const Net& net, const std::string& name, int64_t out, int64_t in,
                             int64_t kernel);

// GroupNorm `name` (config.norm_groups groups, eps config.norm_eps) of x as a per-channel
// affine map, optionally followed by SiLU: the convolution reading x applies it.
ops::ChannelAffine group_norm(const Net& net, const std::string& name, const Tensor& x, bool silu);
// The same statistics of a plane (in memory or in a scratch file); identical results.
ops::ChannelAffine group_norm(const Net& net, const std::string& name, const Plane& x, bool silu);

// ResNet block (ResnetBlock2D, no time embedding) from x.dim(0) to out_channels; consumes x.
Tensor resnet_block(const Net& net, const std::string& prefix, Tensor x, int64_t out_channels);

// Mid block (UNetMidBlock2D): ResNet, self-attention over all positions, ResNet; consumes x.
Tensor mid_block(const Net& net, const std::string& prefix, Tensor x);

// A [C, H, W] copy.
Tensor clone(const Tensor& x);

}  // namespace klein::vae
