// The FLUX.2 VAE decoder. With klein's configuration (channels [128, 256, 512, 512],
// 3 ResNets per level, latent 32):
//
//   post_quant_conv 1×1                                        [32,  H/8, W/8]
//   conv_in 3×3 (32 → 512)                                     [512, H/8, W/8]
//   mid_block: ResNet, attention, ResNet                       [512, H/8, W/8]
//   up_blocks.0: 3 ResNets (512), nearest ×2, conv 3×3         [512, H/4, W/4]
//   up_blocks.1: 3 ResNets (512), nearest ×2, conv 3×3         [512, H/2, W/2]
//   up_blocks.2: 3 ResNets (512 → 256), nearest ×2, conv 3×3   [256, H,   W  ]
//   up_blocks.3: 3 ResNets (256 → 128)                         [128, H,   W  ]
//   conv_norm_out (GroupNorm), SiLU, conv_out 3×3 (128 → 3)    [3,   H,   W  ]
//
// Every GroupNorm has 32 groups and eps 1e-6. Memory at full resolution: the upsampled input
// of an upsampler's conv is never built (the conv reads the half-size tensor through the
// nearest-neighbour map), no normalised tensor is built (each conv normalises the rows it
// reads), and each ResNet holds its input and one intermediate. The peak is therefore in
// up_blocks.3.resnets.0: its 256-channel input plus a 128-channel intermediate, 1.5 GiB at
// 1024x1024 (measured peak RSS of a whole decode with the weights: 1.8 GiB, bench_vae).
// Past VaeMemory::whole_limit the up blocks run banded instead (banded_up_blocks, bands.h):
// 1024x1024 in 0.6 GiB, 2048x2048 in 0.9 GiB, the same image bit for bit.
#include "models/vae/decoder.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "core/error.h"
#include "models/vae/bands.h"
#include "models/vae/vae.h"

namespace klein::vae {

namespace {

// Upsample2D: nearest-neighbour ×2, then a 3×3 convolution; fused into one pass.
Tensor upsample(const Net& net, const std::string& name, const Tensor& x) {
  const int64_t C = x.dim(0);
  ops::Conv2dParams p = ops::Conv2dParams::same(3);
  p.upsample = 2;
  return ops::conv2d(x, load_conv(net, name, C, C, 3), p, net.cx);
}

// The up blocks and the output layers of run_decoder on planes, from the mid block's output.
Tensor banded_up_blocks(const Net& net, const VaeMemory& memory, Tensor mid,
                        const std::function<void()>& step) {
  const Bands bands{memory, memory.dir(), Bands::files_for(net.cx.pool().size())};
  const std::vector<int64_t>& channels = net.config.decoder_channels();
  const int64_t levels = int64_t(channels.size());
  Plane x = Plane::from_tensor(std::move(mid));
  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i) + ".";
    const int64_t out = channels[size_t(levels - 1 - i)];
    for (int64_t j = 0; j <= net.config.layers_per_block; ++j) {
      x = banded_resnet(net, bands, p + "resnets." + std::to_string(j) + ".", std::move(x), out);
      step();
    }
    if (i + 1 < levels) {
      const int64_t C = x.channels();
      Plane y = bands.make(C, 2 * x.height(), 2 * x.width());
      banded_conv(net, bands, x, nullptr, load_conv(net, p + "upsamplers.0.conv", C, C, 3), 2, y);
      x = std::move(y);
      step();
    }
    if (net.observe) net.report("decoder_up_blocks_" + std::to_string(i), x.to_tensor());
  }
  const ops::ChannelAffine norm_out = group_norm(net, "decoder.conv_norm_out", x, /*silu=*/true);
  Plane image(net.config.out_channels, x.height(), x.width());
  banded_conv(net, bands, x, &norm_out,
              load_conv(net, "decoder.conv_out", net.config.out_channels, channels.front(), 3), 1,
              image);
  return image.to_tensor();
}

}  // namespace

Tensor run_decoder(const WeightUnit& weights, const VaeConfig& config, const Tensor& z, Compute& cx,
                   const Observer& observe, const VaeMemory& memory) {
  const Net net{weights, config, cx, observe};
  const std::vector<int64_t>& channels = config.decoder_channels();
  const int64_t levels = int64_t(channels.size());
  const int64_t latent = config.latent_channels;
  check(z.shape().size() == 3 && z.dim(0) == latent, "VAE decoder: expected a latent [", latent,
        ", h, w], got ", shape_str(z.shape()));
  const ops::Conv2dParams same3x3 = ops::Conv2dParams::same(3);
  // Progress: the mid block, each ResNet and upsampler, and the output convolution.
  const int64_t steps = 1 + levels * (config.layers_per_block + 1) + (levels - 1) + 1;
  int64_t done = 0;
  auto step = [&] { cx.report_step(++done, steps); };

  Tensor x = config.use_post_quant_conv
                 ? ops::conv2d(z, load_conv(net, "post_quant_conv", latent, latent, 1),
                               ops::Conv2dParams::same(1), cx)
                 : clone(z);
  if (config.use_post_quant_conv) net.report("post_quant_conv", x);
  x = ops::conv2d(x, load_conv(net, "decoder.conv_in", channels.back(), latent, 3), same3x3, cx);
  net.report("decoder_conv_in", x);

  x = mid_block(net, "decoder.mid_block.", std::move(x));
  net.report("decoder_mid_block", x);
  step();

  const int64_t scale = int64_t(1) << (levels - 1);  // image pixels per latent position
  if (decode_memory(config, z.dim(1) * scale, z.dim(2) * scale, memory).banded) {
    Tensor image = banded_up_blocks(net, memory, std::move(x), step);
    net.report("decoder_conv_out", image);
    step();
    return image;
  }

  // Levels run from the deepest (most channels) to full resolution.
  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "decoder.up_blocks." + std::to_string(i) + ".";
    const int64_t out = channels[size_t(levels - 1 - i)];
    for (int64_t j = 0; j <= config.layers_per_block; ++j) {
      x = resnet_block(net, p + "resnets." + std::to_string(j) + ".", std::move(x), out);
      step();
    }
    if (i + 1 < levels) {
      x = upsample(net, p + "upsamplers.0.conv", x);
      step();
    }
    net.report("decoder_up_blocks_" + std::to_string(i), x);
  }

  const ops::ChannelAffine norm_out = group_norm(net, "decoder.conv_norm_out", x, /*silu=*/true);
  Tensor image =
      ops::conv2d(x, load_conv(net, "decoder.conv_out", config.out_channels, channels.front(), 3),
                  same3x3, cx, &norm_out);
  net.report("decoder_conv_out", image);
  step();
  return image;
}

}  // namespace klein::vae
