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
#include "models/vae/encoder.h"

#include "core/error.h"

namespace klein::vae {

namespace {

Tensor downsample(const Net& net, const std::string& name, const Tensor& x) {
  const int64_t C = x.dim(0);
  ops::Conv2dParams p;
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;
  return ops::conv2d(x, load_conv(net, name, C, C, 3), p, net.cx);
}

}  // namespace

Tensor run_encoder(const WeightUnit& weights, const VaeConfig& config, const Tensor& pixels,
                   Compute& cx, const Observer& observe) {
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

  Tensor x = ops::conv2d(
      pixels, load_conv(net, "encoder.conv_in", channels[0], config.in_channels, 3), same3x3, cx);

  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "encoder.down_blocks." + std::to_string(i) + ".";
    for (int64_t j = 0; j < config.layers_per_block; ++j) {
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
