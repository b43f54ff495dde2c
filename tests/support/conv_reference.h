#pragma once
// The convolution by its definition, for the tests of the convolution kernels (header-only:
// only test programs that link the ops library include it).
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/conv2d.h"
#include "support/testing.h"

namespace klein::testing {

inline float round_bf16(float v) { return bf16_to_f32(f32_to_bf16(v)); }

// Upsample, transform (float32, as the kernels do), pad with zeros, slide the kernel, sum in
// double, add the bias. With `bf16_operands`, the transformed inputs and the weights are
// rounded to bf16 first: what the bf16 kernels multiply.
inline Tensor reference_conv(const Tensor& x, const ops::ChannelAffine* t,
                             const ops::Conv2dWeights& w, const ops::Conv2dParams& p,
                             bool bf16_operands = false) {
  const int64_t C = x.dim(0), H = x.dim(1) * p.upsample, W = x.dim(2) * p.upsample;
  const int64_t k = w.kernel;
  const int64_t OH = (H + p.pad_top + p.pad_bottom - k) / p.stride + 1;
  const int64_t OW = (W + p.pad_left + p.pad_right - k) / p.stride + 1;
  auto operand = [&](float v) -> double { return bf16_operands ? round_bf16(v) : v; };
  auto input = [&](int64_t c, int64_t y, int64_t xx) -> double {
    y -= p.pad_top;
    xx -= p.pad_left;
    if (y < 0 || y >= H || xx < 0 || xx >= W) return 0.0;
    float v = x.data()[(c * x.dim(1) + y / p.upsample) * x.dim(2) + xx / p.upsample];
    if (t) t->apply(c, &v, &v, 1);
    return operand(v);
  };
  Tensor y({w.out_channels, OH, OW});
  for (int64_t co = 0; co < w.out_channels; ++co)
    for (int64_t oy = 0; oy < OH; ++oy)
      for (int64_t ox = 0; ox < OW; ++ox) {
        double s = 0;
        for (int64_t ci = 0; ci < C; ++ci)
          for (int64_t ky = 0; ky < k; ++ky)
            for (int64_t kx = 0; kx < k; ++kx)
              s += operand(w.weight[size_t(((co * C + ci) * k + ky) * k + kx)]) *
                   input(ci, oy * p.stride + ky, ox * p.stride + kx);
        if (!w.bias.empty()) s += w.bias[size_t(co)];
        y.data()[(co * OH + oy) * OW + ox] = float(s);
      }
  return y;
}

// A GroupNorm + SiLU map as the VAE's ResNets apply it (mean, scale, shift per channel).
inline ops::ChannelAffine random_affine(int64_t channels, uint32_t seed) {
  ops::ChannelAffine a;
  a.mean = random_values(channels, seed, 0.2f);
  a.scale = random_values(channels, seed + 1, 0.5f);
  for (float& s : a.scale) s += 1.0f;
  a.shift = random_values(channels, seed + 2, 0.3f);
  a.silu = true;
  return a;
}

// Stride 3 with padding on three sides, none at the bottom: a case no VAE layer has.
inline ops::Conv2dParams odd_params() {
  ops::Conv2dParams p;
  p.stride = 3;
  p.pad_top = 2;
  p.pad_left = 1;
  p.pad_right = 3;
  return p;
}

// Random weights of the scale a trained convolution has (1 / sqrt(fan-in)).
inline ops::Conv2dWeights random_conv(int64_t out, int64_t in, int64_t kernel, uint32_t seed,
                                      bool bias = true) {
  ops::Conv2dWeights w;
  w.out_channels = out;
  w.in_channels = in;
  w.kernel = kernel;
  w.weight = random_values(out * in * kernel * kernel, seed,
                           1.0f / std::sqrt(float(in * kernel * kernel)));
  if (bias) w.bias = random_values(out, seed + 1, 0.1f);
  return w;
}

}  // namespace klein::testing
