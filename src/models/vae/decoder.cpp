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
// Past DecodeMemory::whole_limit the up blocks run banded instead (below, and blocks.h):
// 1024x1024 in 0.6 GiB, 2048x2048 in 1.0 GiB, the same image bit for bit.
#include "models/vae/decoder.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "core/error.h"
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

// ---- The banded decoder (DecodeMemory): the same layers, one band of output rows at a time.

struct Bands {
  const DecodeMemory& memory;
  std::string dir;

  // A [C, H, W] plane, in a scratch file when larger than plane_limit.
  Plane make(int64_t c, int64_t h, int64_t w) const {
    const size_t bytes = size_t(c * h * w) * sizeof(float);
    return Plane(c, h, w, bytes > memory.plane_limit ? dir : "");
  }

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

// y = conv3x3(t(upsample(x))) [+ residual], band by band, bit for bit the whole-image result.
// Output rows [r0, r1) read input rows [a, b): the band's rows, one more on each side where
// the image has them. The convolution runs on those rows alone, so the output rows next to a
// cut saw zero padding instead of their neighbours and are dropped; every kept row saw what
// it sees in the whole image. The cuts are on the convolution's own band boundaries
// (conv2d_band_rows) and each call says where its rows are (origin_row), so the kept rows are
// computed by the same GEMM tiles as in the whole image; a shortcut reads enough rows that
// its tiles (conv2d_tile_pixels, counted from the image's first pixel) are whole too.
// y may be residual.plane (identity residual, same size): a band overwrites only its own
// rows, and the rows the next band reads from it beyond its own are dropped.
void banded_conv(const Net& net, const Bands& bands, const Plane& x, const ops::ChannelAffine* t,
                 const ops::Conv2dWeights& w, int64_t u, Plane& y, Residual residual = {}) {
  const int64_t H = y.height(), W = y.width();
  const int64_t unit = ops::conv2d_band_rows(W);
  const int64_t band = (std::max(bands.rows(x, y), unit) + unit - 1) / unit * unit;
  const int64_t tile = ops::conv2d_tile_pixels();
  struct Range {
    int64_t r0, r1, a, b;  // kept output rows [r0, r1), input rows [a, b)
  };
  std::vector<Range> ranges;
  int64_t widest = 0;
  for (int64_t r0 = 0; r0 < H; r0 += band) {
    const int64_t r1 = std::min(H, r0 + band);
    int64_t a = r0 == 0 ? 0 : (r0 - 1) / u, b = std::min(x.height(), r1 / u + 1);
    if (residual.shortcut) {  // u = 1: whole tiles of the 1×1 convolution's pixels
      a = std::min(a, r0 * W / tile * tile / W);
      b = std::max(b, std::min(H, ((r1 * W + tile - 1) / tile * tile + W - 1) / W));
    }
    ranges.push_back({r0, r1, a, b});
    widest = std::max(widest, b - a);
  }
  // Buffers for the widest band, reused by every band (fresh ones would be page-faulted in
  // for each band).
  ThreadPool* pool = &net.cx.pool();
  Tensor in({x.channels() * widest * x.width()});
  Tensor out({y.channels() * widest * u * W});
  Tensor shortcut_in;
  if (residual.shortcut) shortcut_in = Tensor({residual.plane->channels() * widest * W});
  for (const auto& [r0, r1, a, b] : ranges) {
    ops::Conv2dParams p = ops::Conv2dParams::same(3);
    p.upsample = u;
    p.origin_row = a * u;
    x.read(a, b, in.data(), pool);
    ops::ConvWrite mode = ops::ConvWrite::Overwrite;
    if (residual.plane && !residual.shortcut) {
      residual.plane->read(a * u, b * u, out.data(), pool);
      mode = ops::ConvWrite::Accumulate;
    }
    ops::conv2d({in.data(), x.channels(), b - a, x.width(), t}, w, p, out.data(), mode, net.cx);
    if (residual.shortcut) {
      ops::Conv2dParams pointwise = ops::Conv2dParams::same(1);
      pointwise.origin_row = a;
      residual.plane->read(a, b, shortcut_in.data(), pool);
      ops::conv2d({shortcut_in.data(), residual.plane->channels(), b - a, W, nullptr},
                  *residual.shortcut, pointwise, out.data(), ops::ConvWrite::Accumulate, net.cx);
    }
    y.write(out.data(), (b - a) * u, r0 - a * u, r1 - r0, r0, pool);
    net.cx.stop_if_cancelled();
  }
}

// resnet_block (blocks.cpp) on planes: the same layers in the same order.
Plane banded_resnet(const Net& net, const Bands& bands, const std::string& p, Plane x,
                    int64_t out_channels) {
  net.cx.stop_if_cancelled();
  const int64_t in_channels = x.channels();
  const ops::ChannelAffine norm1 = group_norm(net, p + "norm1", x, /*silu=*/true);
  Plane h = bands.make(out_channels, x.height(), x.width());
  banded_conv(net, bands, x, &norm1, load_conv(net, p + "conv1", out_channels, in_channels, 3), 1,
              h);
  const ops::ChannelAffine norm2 = group_norm(net, p + "norm2", h, /*silu=*/true);
  const ops::Conv2dWeights conv2 = load_conv(net, p + "conv2", out_channels, out_channels, 3);
  if (in_channels == out_channels) {
    banded_conv(net, bands, h, &norm2, conv2, 1, x, {&x, nullptr});
    return x;
  }
  const ops::Conv2dWeights shortcut =
      load_conv(net, p + "conv_shortcut", out_channels, in_channels, 1);
  Plane y = bands.make(out_channels, x.height(), x.width());
  banded_conv(net, bands, h, &norm2, conv2, 1, y, {&x, &shortcut});
  return y;
}

// The up blocks and the output layers of run_decoder on planes, from the mid block's output.
Tensor banded_up_blocks(const Net& net, const DecodeMemory& memory, Tensor mid,
                        const std::function<void()>& step) {
  const Bands bands{memory, memory.dir()};
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
                   const Observer& observe, const DecodeMemory& memory) {
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
  if (decode_is_banded(config, z.dim(1) * scale, z.dim(2) * scale, memory)) {
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
