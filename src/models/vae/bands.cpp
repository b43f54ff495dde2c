#include "models/vae/bands.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace klein::vae {

// y = conv3x3(t(upsample(x))) [+ residual], band by band, bit for bit the whole-image result.
// Output rows [r0, r1) read input rows [a, b): the band's rows, one more on each side where
// the image has them. The convolution runs on those rows alone, so the output rows next to a
// cut would see zero padding instead of their neighbours: the call skips them (skip_top,
// skip_bottom) and nothing of them is kept; every kept row saw what it sees in the whole
// image. The cuts are on the convolution's own band boundaries
// (conv2d_band_rows) and each call says where its rows are (origin_row), so the kept rows are
// computed by the same GEMM tiles as in the whole image; a shortcut reads enough rows that
// its tiles (conv2d_tile_pixels, counted from the image's first pixel) are whole too.
// y may be residual.plane (identity residual, same size): a band overwrites only its own
// rows, and the rows the next band reads from it beyond its own are dropped.
void banded_conv(const Net& net, const Bands& bands, const Plane& x, const ops::ChannelAffine* t,
                 const ops::Conv2dWeights& w, int64_t u, Plane& y, Residual residual) {
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
    // The halo rows above r0 and from r1 on are the neighbouring bands' to compute.
    p.skip_top = r0 - a * u;
    p.skip_bottom = b * u - r1;
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

// Output rows [r0, r1) read input rows [2·r0, 2·r1 + 1): no halo, nothing dropped. Rows the
// image does not have are the zero row below it (pad_bottom of the band's call), so every
// output value sees what it sees in the whole image; as in banded_conv, cuts fall on the
// convolution's own bands and origin_row places each call's rows.
void banded_downsample(const Net& net, const Bands& bands, const Plane& x,
                       const ops::Conv2dWeights& w, Plane& y) {
  const int64_t H = y.height(), W = y.width();
  check(H == ops::conv2d_output_size(x.height(), 3, 2, 0, 1, 1) &&
            W == ops::conv2d_output_size(x.width(), 3, 2, 0, 1, 1),
        "internal: downsampling ", x.height(), "x", x.width(), " into ", H, "x", W);
  const int64_t unit = ops::conv2d_band_rows(W);
  const int64_t band = (std::max(bands.rows(x, y), unit) + unit - 1) / unit * unit;
  ThreadPool* pool = &net.cx.pool();
  const int64_t widest_in = std::min(x.height(), 2 * std::min(band, H) + 1);
  Tensor in({x.channels() * widest_in * x.width()});
  Tensor out({y.channels() * std::min(band, H) * W});
  for (int64_t r0 = 0; r0 < H; r0 += band) {
    const int64_t r1 = std::min(H, r0 + band);
    const int64_t a = 2 * r0, b = std::min(x.height(), 2 * r1 + 1);
    ops::Conv2dParams p;
    p.stride = 2;
    p.pad_bottom = 2 * r1 + 1 - b;
    p.pad_right = 1;
    p.origin_row = r0;
    x.read(a, b, in.data(), pool);
    ops::conv2d({in.data(), x.channels(), b - a, x.width(), nullptr}, w, p, out.data(),
                ops::ConvWrite::Overwrite, net.cx);
    y.write(out.data(), r1 - r0, 0, r1 - r0, r0, pool);
    net.cx.stop_if_cancelled();
  }
}

}  // namespace klein::vae
