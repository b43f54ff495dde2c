#pragma once
// The VAE's layers on planes (core/plane.h), one band of output rows at a time, bit for bit
// the whole-image result: what the decoder (from up_blocks.0) and the encoder (down to the
// last downsampler) run when VaeMemory says the whole image would need too much memory.
#include <algorithm>
#include <cstdint>
#include <string>

#include "core/plane.h"
#include "models/vae/blocks.h"

namespace klein::vae {

// How a banded layer sizes its planes and its bands (VaeMemory, blocks.h).
struct Bands {
  const VaeMemory& memory;
  std::string dir;
  // Scratch files per plane: one per thread (threads copy their own channels in and out, and
  // writes into one file wait for each other), at most 64.
  int files = 1;

  static int files_for(int threads) { return std::clamp(threads, 1, 64); }

  // A [C, H, W] plane, in scratch files when larger than plane_limit.
  Plane make(int64_t c, int64_t h, int64_t w) const {
    const size_t bytes = size_t(c * h * w) * sizeof(float);
    return bytes > memory.plane_limit ? Plane(c, h, w, dir, files) : Plane(c, h, w);
  }

  // Output rows a band aims at (rounded up by each layer to whole convolution bands).
  int64_t rows(const Plane& x, const Plane& y) const {
    if (memory.band_rows > 0) return memory.band_rows;
    const size_t per_row =
        size_t(x.channels() * x.width() + y.channels() * y.width()) * sizeof(float);
    return std::max<int64_t>(8, int64_t(memory.band_bytes / per_row));
  }
};

// A residual added to a convolution's output: the rows of `plane` themselves (identity), or
// a 1×1 convolution of them (ResNet shortcut).
struct Residual {
  const Plane* plane = nullptr;
  const ops::Conv2dWeights* shortcut = nullptr;
};

// y = conv3x3(t(upsample(x, u))) [+ residual], band by band (bands.cpp says how).
void banded_conv(const Net& net, const Bands& bands, const Plane& x, const ops::ChannelAffine* t,
                 const ops::Conv2dWeights& w, int64_t u, Plane& y, Residual residual = {});

// resnet_block (blocks.cpp) on planes: the same layers in the same order; consumes x.
Plane banded_resnet(const Net& net, const Bands& bands, const std::string& prefix, Plane x,
                    int64_t out_channels);

// The encoder's Downsample2D on planes: one zero row below and one zero column to the right,
// then a 3×3 convolution of stride 2; y is [C, (H - 1) / 2, (W - 1) / 2] rounded as conv2d's
// output size.
void banded_downsample(const Net& net, const Bands& bands, const Plane& x,
                       const ops::Conv2dWeights& w, Plane& y);

}  // namespace klein::vae
