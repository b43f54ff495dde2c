// The tiny autoencoder's two halves, top to bottom (the layer tables are in taesd.h). Every
// activation is [64, H, W] float32; the convolutions are the engine's (ops/conv2d.h), in the
// compute context's arithmetic, so they run on every instruction set the VAE's do. ReLU is
// applied in place after the convolution that feeds it; an Upsample is the convolution's own
// nearest-neighbour input map; a Block's residual sum is the last convolution accumulating
// into its input.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "models/taesd/layers.h"
#include "ops/finite.h"
#include "ops/group_norm.h"

namespace klein::taesd {

namespace {

const ops::Conv2dParams kSame3x3 = ops::Conv2dParams::same(3);
const ops::Conv2dParams kPointwise = ops::Conv2dParams::same(1);

ops::Conv2dParams upsampled_3x3() {
  ops::Conv2dParams p = ops::Conv2dParams::same(3);
  p.upsample = 2;
  return p;
}

ops::Conv2dParams strided_3x3() {
  ops::Conv2dParams p;
  p.stride = 2;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = 1;
  return p;
}

void relu(Tensor& x, Compute& cx) {
  float* d = x.data();
  const int64_t rows = x.dim(0) * (x.shape().size() > 1 ? x.dim(1) : 1);
  const int64_t width = x.numel() / std::max<int64_t>(rows, 1);
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t i = r0 * width; i < r1 * width; ++i) d[i] = d[i] > 0.0f ? d[i] : 0.0f;
  });
}

// What both halves run with: their convolutions and norms, the context and the observer.
struct Net {
  const std::map<std::string, ops::Conv2dWeights>& convs;
  const std::map<std::string, std::vector<float>>& norms;
  Compute& cx;
  const Observer& observe;
  const char* half;  // "decoder" / "encoder"

  const ops::Conv2dWeights& conv(const std::string& name) const { return convs.at(name); }
  void report(int layer, const Tensor& x) const {
    if (observe) observe(std::string(half) + "." + std::to_string(layer), x);
  }
};

// Block: x ← x + pool(x) (when it has one); y = ReLU(conv.4(ReLU(conv.2(ReLU(conv.0(x))))) + x).
// Consumes x [64, H, W]; memory: x, the intermediate h (reused from block to block: a fresh
// tensor of that size costs its page faults again), and the pool's [256, H, W].
// `origin_row`: the row of the whole plane that x's row 0 is, when x is a band of it (its
// convolutions then keep the whole plane's bits: ops::Conv2dParams::origin_row).
Tensor block(const Net& n, int layer, Tensor x, bool pool, Tensor& h, int64_t origin_row = 0) {
  ops::Conv2dParams same3 = kSame3x3;
  same3.origin_row = origin_row;
  n.cx.stop_if_cancelled();
  const std::string p = std::to_string(layer);
  if (pool) {
    // pool: 1x1 (64 → 256), GroupNorm(4, 256), ReLU, 1x1 (256 → 64), added to x
    Tensor g = ops::conv2d(x, n.conv(p + ".pool.0"), kPointwise, n.cx);  // [256, H, W]
    const int64_t pixels = g.dim(1) * g.dim(2);
    const ops::ChannelAffine norm = ops::group_norm_affine(
        g.data(), kPoolChannels, pixels, kPoolGroups, n.norms.at(p + ".pool.1.weight").data(),
        n.norms.at(p + ".pool.1.bias").data(), kPoolEps, /*silu=*/false, n.cx);
    ops::apply_channel_affine(g.data(), g.data(), kPoolChannels, pixels, norm, n.cx);
    relu(g, n.cx);
    ops::conv2d_into(g, nullptr, n.conv(p + ".pool.3"), kPointwise, x, ops::ConvWrite::Accumulate,
                     n.cx);
  }
  if (h.shape() != x.shape()) h = Tensor(x.shape());
  ops::conv2d_into(x, nullptr, n.conv(p + ".conv.0"), same3, h, ops::ConvWrite::Overwrite,
                   n.cx);  // [64, H, W]
  relu(h, n.cx);
  if (origin_row == 0)
    ops::conv2d_into(h, nullptr, n.conv(p + ".conv.2"), same3, h, ops::ConvWrite::Overwrite, n.cx);
  else  // a band: in place works on whole planes only
    h = ops::conv2d(h, n.conv(p + ".conv.2"), same3, n.cx);
  relu(h, n.cx);
  // The skip is the identity (64 → 64): the last conv accumulates into x, then fuse = ReLU.
  ops::conv2d_into(h, nullptr, n.conv(p + ".conv.4"), same3, x, ops::ConvWrite::Accumulate,
                   n.cx);
  relu(x, n.cx);
  return x;
}

Tensor blocks(const Net& n, std::initializer_list<int> layers, Tensor x, bool pool,
              int64_t origin_row = 0) {
  Tensor h;
  for (int layer : layers) {
    x = block(n, layer, std::move(x), pool, h, origin_row);
    n.report(layer, x);
  }
  return x;
}

// ---- Bands: the decoder's last two stages on horizontal bands of the 2h plane

// Layers 12-19 (from the [64, 2h, 2w] plane after layer 10 to the image) on bands of the
// plane, each with 7 rows of the plane above and below it (the 10 convolutions at 4h and 5 at
// 8h reach 6.25 rows of 2h): every call is the whole-plane call on fewer rows, its tiles laid
// out from the plane's row 0 (origin_row), so the band's own rows come out with the whole
// plane's bits, and the rows next to a band's inner edges, which saw zeros there instead of
// the plane's rows, are never kept. No buffer holds more than a band of [64, 8h, 8w].
Tensor decode_tail_in_bands(const Net& whole, const Tensor& x2, int64_t rows) {
  constexpr int64_t kHalo = 7;
  const Observer none;  // a band's layers are not the plane's: the caller reports the image
  const Net n{whole.convs, whole.norms, whole.cx, none, whole.half};
  const int64_t c = x2.dim(0), h2 = x2.dim(1), w2 = x2.dim(2);
  Tensor image({3, 4 * h2, 4 * w2});
  for (int64_t y0 = 0; y0 < h2; y0 += rows) {
    n.cx.stop_if_cancelled();
    const int64_t y1 = std::min(h2, y0 + rows);
    const int64_t a = std::max<int64_t>(0, y0 - kHalo), b = std::min(h2, y1 + kHalo);
    Tensor x({c, b - a, w2});
    for (int64_t ch = 0; ch < c; ++ch)
      std::memcpy(x.data() + ch * (b - a) * w2, x2.data() + (ch * h2 + a) * w2,
                  size_t((b - a) * w2) * sizeof(float));
    ops::Conv2dParams up = upsampled_3x3();
    up.origin_row = 2 * a;
    x = ops::conv2d(x, n.conv("12"), up, n.cx);  // [64, 2 (b - a), 4w], rows from 2a
    x = blocks(n, {13, 14, 15}, std::move(x), false, 2 * a);
    up.origin_row = 4 * a;
    x = ops::conv2d(x, n.conv("17"), up, n.cx);  // [64, 4 (b - a), 8w], rows from 4a
    x = blocks(n, {18}, std::move(x), false, 4 * a);
    ops::Conv2dParams last = kSame3x3;
    last.origin_row = 4 * a;
    const Tensor out = ops::conv2d(x, n.conv("19"), last, n.cx);  // [3, 4 (b - a), 8w]
    const int64_t W = 4 * w2, from = 4 * y0, to = 4 * y1;  // the band's own output rows
    for (int64_t ch = 0; ch < 3; ++ch)
      std::memcpy(image.data() + (ch * 4 * h2 + from) * W,
                  out.data() + (ch * out.dim(1) + from - 4 * a) * W,
                  size_t((to - from) * W) * sizeof(float));
  }
  return image;
}

// The first conv's shape names the latent width; a network of another width than the
// caller's latents is refused here, before any work.
int64_t latent_width(const Layers& l, const std::string& conv, bool input, int64_t expected,
                     const std::string& use) {
  const Shape* s = l.shape_of(conv + ".weight");
  check(s != nullptr && s->size() == 4, l.where(), ": tensor ", conv,
        ".weight is missing or not a 4-D convolution weight");
  const int64_t width = input ? (*s)[1] : (*s)[0];
  check(width > 0 && width <= 4096, l.where(), ": ", conv, ".weight gives ", width,
        " latent channels");
  check(expected == 0 || width == expected, l.where(), ": a tiny autoencoder of ",
        describe_latent_width(width), "; ", use.empty() ? std::string("the latents") : use,
        " need one of ", describe_latent_width(expected));
  return width;
}

}  // namespace

// ---- Decoder

TinyDecoder::TinyDecoder(const std::filesystem::path& path, int64_t expected,
                         const std::string& use)
    : TinyDecoder(read_tiny_weights(path, Half::Decoder), expected, use) {}

TinyDecoder::TinyDecoder(TinyWeights weights, int64_t expected, const std::string& use)
    : path_(weights.path) {
  Layers l(std::move(weights));
  latent_channels_ = latent_width(l, "1", /*input=*/true, expected, use);
  mid_block_norm_ = l.has("3.pool.0.weight");
  l.conv("1", kChannels, latent_channels_, 3, true);
  for (int i : {3, 4, 5}) l.block(std::to_string(i), mid_block_norm_);
  for (int i : {7, 12, 17}) l.conv(std::to_string(i), kChannels, kChannels, 3, false);
  for (int i : {8, 9, 10, 13, 14, 15, 18}) l.block(std::to_string(i), false);
  l.conv("19", 3, kChannels, 3, true);
  l.finish();
  convs_ = std::move(l.convs);
  norms_ = std::move(l.norms);
}

int64_t TinyDecoder::band_rows_for(int64_t h, int64_t w, uint64_t whole_limit,
                                   uint64_t band_bytes) {
  const uint64_t row_bytes_8h = uint64_t(kChannels) * uint64_t(8 * w) * sizeof(float);
  // The last stage holds two [64, 8h, 8w] planes (x and h) and the [3, 8h, 8w] image.
  if ((2 * row_bytes_8h + row_bytes_8h * 3 / uint64_t(kChannels)) * uint64_t(8 * h) <= whole_limit)
    return 0;
  // A band of r rows of 2h holds 4 (r + 2·7) rows at 8h (its halo on both sides).
  const int64_t rows_8h = int64_t(band_bytes / row_bytes_8h);
  return std::max<int64_t>(8, (rows_8h - 56) / 4);
}

Tensor TinyDecoder::decode(const Tensor& latents, Compute& cx, const Observer& observe,
                           int64_t band_rows) const {
  check(latents.shape().size() == 3 && latents.dim(0) == latent_channels_ && latents.dim(1) > 0 &&
            latents.dim(2) > 0,
        path_.string(), ": the tiny decoder takes latents [", latent_channels_, ", h, w], got ",
        shape_str(latents.shape()));
  const Net n{convs_, norms_, cx, observe, "decoder"};
  // Clamp: 3·tanh(z/3)                                                 [C, h, w]
  Tensor x = latents.copy();
  float* d = x.data();
  cx.pool().parallel_for(x.numel(), [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) d[i] = std::tanh(d[i] / 3.0f) * 3.0f;
  });
  n.report(0, x);
  x = ops::conv2d(x, n.conv("1"), kSame3x3, cx);  // [64, h, w]
  relu(x, cx);
  n.report(2, x);
  x = blocks(n, {3, 4, 5}, std::move(x), mid_block_norm_);
  x = ops::conv2d(x, n.conv("7"), upsampled_3x3(), cx);  // [64, 2h, 2w]
  n.report(7, x);
  x = blocks(n, {8, 9, 10}, std::move(x), false);
  if (band_rows > 0) {
    // The rest in bands of the 2h plane; each band's rows come out with the whole plane's bits.
    Tensor image = decode_tail_in_bands(n, x, band_rows);
    n.report(19, image);
    ops::require_finite(image.data(), image.numel(), "the tiny decoder's output", cx);
    return image;
  }
  x = ops::conv2d(x, n.conv("12"), upsampled_3x3(), cx);  // [64, 4h, 4w]
  n.report(12, x);
  x = blocks(n, {13, 14, 15}, std::move(x), false);
  x = ops::conv2d(x, n.conv("17"), upsampled_3x3(), cx);  // [64, 8h, 8w]
  n.report(17, x);
  x = blocks(n, {18}, std::move(x), false);
  Tensor image = ops::conv2d(x, n.conv("19"), kSame3x3, cx);  // [3, 8h, 8w]
  n.report(19, image);
  ops::require_finite(image.data(), image.numel(), "the tiny decoder's output", cx);
  return image;
}

// ---- Encoder

TinyEncoder::TinyEncoder(const std::filesystem::path& path, int64_t expected,
                         const std::string& use)
    : TinyEncoder(read_tiny_weights(path, Half::Encoder), expected, use) {}

TinyEncoder::TinyEncoder(TinyWeights weights, int64_t expected, const std::string& use)
    : path_(weights.path) {
  Layers l(std::move(weights));
  latent_channels_ = latent_width(l, "14", /*input=*/false, expected, use);
  mid_block_norm_ = l.has("11.pool.0.weight");
  l.conv("0", kChannels, 3, 3, true);
  for (int i : {2, 6, 10}) l.conv(std::to_string(i), kChannels, kChannels, 3, false);
  for (int i : {1, 3, 4, 5, 7, 8, 9}) l.block(std::to_string(i), false);
  for (int i : {11, 12, 13}) l.block(std::to_string(i), mid_block_norm_);
  l.conv("14", latent_channels_, kChannels, 3, true);
  l.finish();
  convs_ = std::move(l.convs);
  norms_ = std::move(l.norms);
}

Tensor TinyEncoder::encode(const Tensor& image, Compute& cx, const Observer& observe) const {
  check(image.shape().size() == 3 && image.dim(0) == 3, path_.string(),
        ": the tiny encoder takes an image [3, H, W], got ", shape_str(image.shape()));
  check(image.dim(1) > 0 && image.dim(2) > 0 && image.dim(1) % 8 == 0 && image.dim(2) % 8 == 0,
        path_.string(), ": the tiny encoder takes an image whose sides are multiples of 8, got ",
        image.dim(2), "x", image.dim(1), " (WxH)");
  const Net n{convs_, norms_, cx, observe, "encoder"};
  Tensor x = ops::conv2d(image, n.conv("0"), kSame3x3, cx);  // [64, H, W]
  n.report(0, x);
  x = blocks(n, {1}, std::move(x), false);
  x = ops::conv2d(x, n.conv("2"), strided_3x3(), cx);  // [64, H/2, W/2]
  n.report(2, x);
  x = blocks(n, {3, 4, 5}, std::move(x), false);
  x = ops::conv2d(x, n.conv("6"), strided_3x3(), cx);  // [64, H/4, W/4]
  n.report(6, x);
  x = blocks(n, {7, 8, 9}, std::move(x), false);
  x = ops::conv2d(x, n.conv("10"), strided_3x3(), cx);  // [64, H/8, W/8]
  n.report(10, x);
  x = blocks(n, {11, 12, 13}, std::move(x), mid_block_norm_);
  Tensor latents = ops::conv2d(x, n.conv("14"), kSame3x3, cx);  // [C, H/8, W/8]
  n.report(14, latents);
  ops::require_finite(latents.data(), latents.numel(), "the tiny encoder's output", cx);
  return latents;
}

}  // namespace klein::taesd
