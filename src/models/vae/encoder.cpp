// The FLUX.2 VAE encoder. With klein's configuration (channels [128, 256, 512, 512],
// 2 ResNets per level, latent 32):
//
//   conv_in 3×3 (3 → 128)                                      [128, H,   W  ]
//   down_blocks.0: 2 ResNets (128), downsample                 [128, H/2, W/2]
//   down_blocks.1: 2 ResNets (128 → 256), downsample           [256, H/4, W/4]
//   down_blocks.2: 2 ResNets (256 → 512), downsample           [512, H/8, W/8]
//   down_blocks.3: 2 ResNets (512)                             [512, H/8, W/8]
//   mid_block: ResNet, attention, ResNet                       [512, H/8, W/8]
//   conv_norm_out (GroupNorm), SiLU, conv_out 3×3 (512 → 64)   [64,  H/8, W/8]
//   quant_conv 1×1                                             [64,  H/8, W/8]
//
// The downsampler pads one zero column on the right and one zero row at the bottom only, then
// runs a 3×3 convolution of stride 2 without padding (diffusers Downsample2D, padding=0).
// Memory: the peak is in down_blocks.0, two 128-channel tensors at full resolution (1 GiB at
// 1024x1024). Past VaeMemory::whole_limit conv_in and the down blocks run banded instead
// (banded_down_blocks, bands.h): 1024x1024 in 0.7 GiB with the weights, the same result bit
// for bit.
#include "models/vae/encoder.h"

#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "models/vae/bands.h"
#include "models/vae/vae.h"

namespace klein::vae {

namespace {

Tensor downsample(const Net& net, const std::string& name, const Tensor& x) {
  const int64_t C = x.dim(0);
  ops::Conv2dParams p;
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;
  return ops::conv2d(x, load_conv(net, name, C, C, 3), p, net.cx);
}

// conv_in and the down blocks over the whole image, to the deepest level's [C, H/8, W/8].
Tensor down_blocks(const Net& net, const Tensor& pixels, const std::function<void()>& step) {
  const std::vector<int64_t>& channels = net.config.block_out_channels;
  const int64_t levels = int64_t(channels.size());
  Tensor x =
      ops::conv2d(pixels, load_conv(net, "encoder.conv_in", channels[0], net.config.in_channels, 3),
                  ops::Conv2dParams::same(3), net.cx);
  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int64_t j = 0; j < net.config.layers_per_block; ++j) {
      x = resnet_block(net, p + "resnets." + std::to_string(j) + ".", std::move(x),
                       channels[size_t(i)]);
      step();
    }
    if (i + 1 < levels) {
      x = downsample(net, p + "downsamplers.0.conv", x);
      step();
    }
    net.report("encoder_down_blocks_" + std::to_string(i), x);
  }
  return x;
}

// conv_in and the down blocks of run_encoder on planes (bands.h), to the deepest level's
// tensor [C, H/8, W/8].
Tensor banded_down_blocks(const Net& net, const VaeMemory& memory, const Tensor& pixels,
                          const std::function<void()>& step) {
  const Bands bands{memory, memory.dir(), Bands::files_for(net.cx.pool().size())};
  const std::vector<int64_t>& channels = net.config.block_out_channels;
  const int64_t levels = int64_t(channels.size());
  Tensor copy(pixels.shape());
  std::memcpy(copy.data(), pixels.data(), size_t(pixels.numel()) * sizeof(float));
  const Plane image = Plane::from_tensor(std::move(copy));
  Plane x = bands.make(channels[0], image.height(), image.width());
  banded_conv(net, bands, image, nullptr,
              load_conv(net, "encoder.conv_in", channels[0], net.config.in_channels, 3), 1, x);
  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int64_t j = 0; j < net.config.layers_per_block; ++j) {
      x = banded_resnet(net, bands, p + "resnets." + std::to_string(j) + ".", std::move(x),
                        channels[size_t(i)]);
      step();
    }
    if (i + 1 < levels) {
      const int64_t C = x.channels();
      Plane y = bands.make(C, ops::conv2d_output_size(x.height(), 3, 2, 0, 1, 1),
                           ops::conv2d_output_size(x.width(), 3, 2, 0, 1, 1));
      banded_downsample(net, bands, x, load_conv(net, p + "downsamplers.0.conv", C, C, 3), y);
      x = std::move(y);
      step();
    }
    if (net.observe) net.report("encoder_down_blocks_" + std::to_string(i), x.to_tensor());
  }
  return x.to_tensor();
}

}  // namespace

Tensor run_encoder(const WeightUnit& weights, const VaeConfig& config, const Tensor& pixels,
                   Compute& cx, const Observer& observe, const VaeMemory& memory) {
  const Net net{weights, config, cx, observe};
  const std::vector<int64_t>& channels = config.block_out_channels;
  const int64_t levels = int64_t(channels.size());
  const int64_t moments = 2 * config.latent_channels;
  check(pixels.shape().size() == 3 && pixels.dim(0) == config.in_channels,
        "VAE encoder: expected an image [", config.in_channels, ", H, W], got ",
        shape_str(pixels.shape()));
  const ops::Conv2dParams same3x3 = ops::Conv2dParams::same(3);
  // Progress: each ResNet and downsampler, the mid block, and the output convolution.
  const int64_t steps = levels * config.layers_per_block + (levels - 1) + 1 + 1;
  int64_t done = 0;
  auto step = [&] { cx.report_step(++done, steps); };

  Tensor x = encode_memory(config, pixels.dim(1), pixels.dim(2), memory).banded
                 ? banded_down_blocks(net, memory, pixels, step)
                 : down_blocks(net, pixels, step);

  x = mid_block(net, "encoder.mid_block.", std::move(x));
  net.report("encoder_mid_block", x);
  step();

  const ops::ChannelAffine norm_out = group_norm(net, "encoder.conv_norm_out", x, /*silu=*/true);
  x = ops::conv2d(x, load_conv(net, "encoder.conv_out", moments, channels.back(), 3), same3x3, cx,
                  &norm_out);
  net.report("encoder_conv_out", x);
  step();

  if (config.use_quant_conv) {
    x = ops::conv2d(x, load_conv(net, "quant_conv", moments, moments, 1),
                    ops::Conv2dParams::same(1), cx);
    net.report("quant_conv", x);
  }
  return x;
}

}  // namespace klein::vae
