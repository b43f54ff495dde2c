#include "models/vae/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/attention.h"
#include "ops/linear.h"

namespace klein::vae {

namespace {

const ops::Conv2dParams kSame3x3 = ops::Conv2dParams::same(3);
const ops::Conv2dParams kPointwise = ops::Conv2dParams::same(1);

void check_shape(const Weight& w, const Shape& expected) {
  check(w.shape == expected, "tensor ", w.name, " is ", shape_str(w.shape), ", expected ",
        shape_str(expected));
}

// Square tiles keep both sides of a transpose in cache.
constexpr int64_t kTransposeTile = 32;

// tokens [P, C] ← norm(x [C, P]): each channel's values through the affine map, transposed.
void normalized_tokens(const float* x, int64_t channels, int64_t pixels,
                       const ops::ChannelAffine& norm, float* tokens, Compute& cx) {
  const int64_t tiles = (pixels + kTransposeTile - 1) / kTransposeTile;
  cx.pool().parallel_for(tiles, [&](int64_t t0, int64_t t1, int) {
    float row[kTransposeTile];
    for (int64_t p0 = t0 * kTransposeTile; p0 < std::min(pixels, t1 * kTransposeTile);
         p0 += kTransposeTile) {
      const int64_t n = std::min(kTransposeTile, pixels - p0);
      for (int64_t c = 0; c < channels; ++c) {
        norm.apply(c, x + c * pixels + p0, row, n);
        for (int64_t i = 0; i < n; ++i) tokens[(p0 + i) * channels + c] = row[i];
      }
    }
  });
}

// x [C, P] += tokens [P, C]ᵀ
void add_tokens_to_channels(const float* tokens, int64_t channels, int64_t pixels, float* x,
                            Compute& cx) {
  const int64_t tiles = (channels + kTransposeTile - 1) / kTransposeTile;
  cx.pool().parallel_for(tiles, [&](int64_t t0, int64_t t1, int) {
    for (int64_t c0 = t0 * kTransposeTile; c0 < std::min(channels, t1 * kTransposeTile);
         c0 += kTransposeTile)
      for (int64_t p0 = 0; p0 < pixels; p0 += kTransposeTile)
        for (int64_t c = c0; c < std::min(channels, c0 + kTransposeTile); ++c)
          for (int64_t p = p0; p < std::min(pixels, p0 + kTransposeTile); ++p)
            x[c * pixels + p] += tokens[p * channels + c];
  });
}

// out [P, C] = tokens [P, C] · Wᵀ + b for the Linear `name` ([C, C] + bias [C]).
Tensor project(const Net& net, const std::string& name, const Tensor& tokens) {
  const int64_t P = tokens.dim(0), C = tokens.dim(1);
  const Weight& w = net.weights.get(name + ".weight");
  const Weight& b = net.weights.get(name + ".bias");
  check_shape(w, {C, C});
  check_shape(b, {C});
  Tensor out({P, C});
  ops::linear(tokens.data(), P, w, out.data(), net.cx);
  const std::vector<float> bias = weight_to_floats(b);
  net.cx.pool().parallel_for(P, [&](int64_t p0, int64_t p1, int) {
    ops::add_bias(out.row(p0), p1 - p0, C, C, bias.data());
  });
  return out;
}

// Self-attention over the H·W positions with one head of all C channels (diffusers Attention
// with group_norm and a residual connection):
//   u = group_norm(x) read as tokens [H·W, C];  q, k, v = to_q(u), to_k(u), to_v(u)
//   x ← x + to_out.0(softmax(q kᵀ / √C) v)
// The attention itself is tiled: at 1024² there are 16384 positions and the score matrix
// would be 1 GiB.
void attention_block(const Net& net, const std::string& p, Tensor& x) {
  // The transformer's switches (attention and float projections on bf16 tiles) are not the
  // VAE's: its fast arithmetic is the convolutions' alone (pipeline.h, Precision).
  const Compute::Use float32(net.cx, {.fast_convolutions = net.cx.arithmetic.fast_convolutions});
  const int64_t C = x.dim(0), P = x.dim(1) * x.dim(2);
  Tensor q, k, v;
  {
    const ops::ChannelAffine norm = group_norm(net, p + "group_norm", x, /*silu=*/false);
    Tensor tokens({P, C});
    normalized_tokens(x.data(), C, P, norm, tokens.data(), net.cx);
    q = project(net, p + "to_q", tokens);
    k = project(net, p + "to_k", tokens);
    v = project(net, p + "to_v", tokens);
  }
  Tensor attended({P, C});
  ops::AttentionParams a;
  a.q_len = a.kv_len = P;
  a.heads = a.kv_heads = 1;
  a.head_dim = C;
  a.scale = 1.0f / std::sqrt(float(C));
  ops::attention(q.data(), C, k.data(), C, v.data(), C, attended.data(), C, a, net.cx);
  q = Tensor();
  k = Tensor();
  v = Tensor();
  const Tensor out = project(net, p + "to_out.0", attended);
  add_tokens_to_channels(out.data(), C, P, x.data(), net.cx);
}

}  // namespace

ops::Conv2dWeights load_conv(const Net& net, const std::string& name, int64_t out, int64_t in,
                             int64_t kernel) {
  const Weight& w = net.weights.get(name + ".weight");
  const Weight& b = net.weights.get(name + ".bias");
  check_shape(w, {out, in, kernel, kernel});
  check_shape(b, {out});
  ops::Conv2dWeights c;
  c.out_channels = out;
  c.in_channels = in;
  c.kernel = kernel;
  c.weight = weight_to_floats(w);
  c.bias = weight_to_floats(b);
  return c;
}

ops::ChannelAffine group_norm(const Net& net, const std::string& name, const Tensor& x, bool silu) {
  const int64_t C = x.dim(0);
  const Weight& gamma = net.weights.get(name + ".weight");
  const Weight& beta = net.weights.get(name + ".bias");
  check_shape(gamma, {C});
  check_shape(beta, {C});
  const std::vector<float> g = weight_to_floats(gamma), b = weight_to_floats(beta);
  return ops::group_norm_affine(x.data(), C, x.dim(1) * x.dim(2), net.config.norm_groups, g.data(),
                                b.data(), float(net.config.norm_eps), silu, net.cx);
}

ops::ChannelAffine group_norm(const Net& net, const std::string& name, const Plane& x, bool silu) {
  const int64_t C = x.channels(), pixels = x.height() * x.width();
  const Weight& gamma = net.weights.get(name + ".weight");
  const Weight& beta = net.weights.get(name + ".bias");
  check_shape(gamma, {C});
  check_shape(beta, {C});
  const std::vector<float> g = weight_to_floats(gamma), b = weight_to_floats(beta);
  const int64_t per_group = C / std::max<int64_t>(net.config.norm_groups, 1) * pixels;
  auto read = [&x, per_group](int64_t group, int64_t offset, int64_t n, float* buffer) {
    return x.span(group * per_group + offset, n, buffer);
  };
  return ops::group_norm_affine(read, C, pixels, net.config.norm_groups, g.data(), b.data(),
                                float(net.config.norm_eps), silu, net.cx);
}

// h = conv1(silu(norm1(x)));  h = conv2(silu(norm2(h)));  out = shortcut(x) + h,
// shortcut = 1×1 conv when the channel count changes, identity otherwise.
// Memory: x and h only. The normalised tensors never exist (each conv normalises the rows it
// gathers), and conv2 either accumulates into x or overwrites its own input.
Tensor resnet_block(const Net& net, const std::string& p, Tensor x, int64_t out_channels) {
  net.cx.stop_if_cancelled();
  const int64_t in_channels = x.dim(0);
  const ops::ChannelAffine norm1 = group_norm(net, p + "norm1", x, /*silu=*/true);
  Tensor h = ops::conv2d(x, load_conv(net, p + "conv1", out_channels, in_channels, 3), kSame3x3,
                         net.cx, &norm1);
  const ops::ChannelAffine norm2 = group_norm(net, p + "norm2", h, /*silu=*/true);
  const ops::Conv2dWeights conv2 = load_conv(net, p + "conv2", out_channels, out_channels, 3);
  if (in_channels == out_channels) {
    ops::conv2d_into(h, &norm2, conv2, kSame3x3, x, ops::ConvWrite::Accumulate, net.cx);
    return x;
  }
  ops::conv2d_into(h, &norm2, conv2, kSame3x3, h, ops::ConvWrite::Overwrite, net.cx);
  ops::conv2d_into(x, nullptr, load_conv(net, p + "conv_shortcut", out_channels, in_channels, 1),
                   kPointwise, h, ops::ConvWrite::Accumulate, net.cx);
  return h;
}

Tensor mid_block(const Net& net, const std::string& p, Tensor x) {
  const int64_t C = x.dim(0);
  x = resnet_block(net, p + "resnets.0.", std::move(x), C);
  if (net.config.mid_block_attention) attention_block(net, p + "attentions.0.", x);
  return resnet_block(net, p + "resnets.1.", std::move(x), C);
}

Tensor clone(const Tensor& x) {
  Tensor y(x.shape());
  std::memcpy(y.data(), x.data(), size_t(x.numel()) * sizeof(float));
  return y;
}

}  // namespace klein::vae
