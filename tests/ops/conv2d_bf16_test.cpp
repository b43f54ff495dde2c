// The bf16 convolutions, ConvAlgorithm::Bf16Tiles (AMX BF16 tiles) and Bf16Direct (AVX-512
// BF16 dot products, stride 1), against the exact float32 paths at every geometry the VAE
// runs, and against the definition evaluated on the same bf16-rounded operands. Each test
// runs for both algorithms, skipped where the CPU lacks one.
//
// Error bound: bf16 keeps 8 significant bits (relative rounding error <= 2^-9), so each
// product is off by up to ~4e-3 relative and a sum of K random-signed products by about
// 2^-9·sqrt(K)·|x||w| rms, a few 1e-3 of max|y|. Measured here (scaled difference
// max|bf16 - exact| / max|exact|): 1.3e-3 to 3.4e-3 over the cases below; the bound is 1e-2.
// Against the definition on the bf16-rounded operands, summed in double, only float32
// rounding of the sums remains: measured <= 4e-7, bound 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <string>

#include "core/dtype.h"
#include "ops/conv2d.h"
#include "ops/group_norm.h"
#include "support/conv_reference.h"
#include "support/testing.h"
#include "support/isa.h"

namespace klein {
namespace {

using ops::ChannelAffine;
using ops::Conv2dParams;
using ops::Conv2dWeights;
using ops::ConvAlgorithm;
using ops::ConvWrite;

constexpr double kBf16Bound = 1e-2;       // against the float32 result, scaled by max|ref|
constexpr double kRoundedBound = 1e-5;    // against the definition on bf16-rounded operands

using testing::odd_params;
using testing::random_affine;
using testing::random_conv;
using testing::random_tensor;
using testing::random_values;
using testing::reference_conv;
using testing::round_bf16;

Tensor copy_of(const Tensor& x) {
  Tensor y(x.shape());
  std::memcpy(y.data(), x.data(), size_t(x.numel()) * sizeof(float));
  return y;
}

Conv2dParams same3x3() { return Conv2dParams::same(3); }
Conv2dParams pointwise() { return Conv2dParams{}; }
Conv2dParams downsample() {  // the VAE encoder's: a zero row/column on the bottom/right only
  Conv2dParams p;
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;
  return p;
}
Conv2dParams upsample() {  // the VAE decoder's Upsample2D: nearest x2, then a 3x3 conv
  Conv2dParams p = Conv2dParams::same(3);
  p.upsample = 2;
  return p;
}

Conv2dParams with(Conv2dParams p, ConvAlgorithm a) {
  p.algorithm = a;
  return p;
}

const char* path_of(ConvAlgorithm a) {
  return a == ConvAlgorithm::Bf16Tiles ? "amx" : "avx512-bf16";
}

bool available(ConvAlgorithm a) {
  return a == ConvAlgorithm::Bf16Tiles ? ops::conv2d_bf16_tiles_available()
                                       : ops::conv2d_bf16_direct_available();
}

// The direct kernel has no strided form.
bool runs(ConvAlgorithm a, const Conv2dParams& p) {
  return a != ConvAlgorithm::Bf16Direct || p.stride == 1;
}

class Conv2dBf16 : public ::testing::TestWithParam<ConvAlgorithm> {};

struct Bf16ConvCase {
  const char* name;
  int64_t in, out, height, width, kernel;
  Conv2dParams params;
  bool transform;   // GroupNorm + SiLU on the input
  bool bias;
  ConvWrite mode;
};

// Every kind of convolution of the decoder and encoder at klein's channel counts, on small
// images whose sides are not multiples of 16 (partial pixel blocks, rows straddling blocks).
const Bf16ConvCase kVaeCases[] = {
    {"resnet_512", 512, 512, 12, 21, 3, same3x3(), true, true, ConvWrite::Overwrite},
    {"resnet_512_accumulate", 512, 512, 9, 10, 3, same3x3(), true, true, ConvWrite::Accumulate},
    {"resnet_512_to_256", 512, 256, 11, 19, 3, same3x3(), true, true, ConvWrite::Overwrite},
    {"resnet_256_to_128", 256, 128, 13, 35, 3, same3x3(), true, true, ConvWrite::Overwrite},
    {"resnet_128", 128, 128, 17, 33, 3, same3x3(), true, true, ConvWrite::Accumulate},
    {"shortcut_512_to_256", 512, 256, 11, 19, 1, pointwise(), false, true, ConvWrite::Accumulate},
    {"shortcut_256_to_128", 256, 128, 13, 35, 1, pointwise(), false, true, ConvWrite::Accumulate},
    {"post_quant_conv", 32, 32, 5, 7, 1, pointwise(), false, true, ConvWrite::Overwrite},
    {"decoder_conv_in", 32, 512, 5, 7, 3, same3x3(), false, true, ConvWrite::Overwrite},
    {"upsampler_512", 512, 512, 6, 9, 3, upsample(), false, true, ConvWrite::Overwrite},
    {"upsampler_256", 256, 256, 7, 11, 3, upsample(), false, true, ConvWrite::Overwrite},
    {"decoder_conv_out", 128, 3, 19, 23, 3, same3x3(), true, true, ConvWrite::Overwrite},
    {"encoder_conv_in", 3, 128, 19, 23, 3, same3x3(), false, true, ConvWrite::Overwrite},
    {"downsampler_even", 128, 128, 18, 34, 3, downsample(), false, true, ConvWrite::Overwrite},
    {"downsampler_odd", 256, 256, 13, 21, 3, downsample(), false, true, ConvWrite::Overwrite},
    {"encoder_conv_out", 512, 64, 7, 9, 3, same3x3(), true, true, ConvWrite::Overwrite},
    {"quant_conv_no_bias", 64, 64, 7, 9, 1, pointwise(), false, false, ConvWrite::Overwrite},
};

// Runs `algorithm` on the case's input; in Accumulate mode onto a fixed random output.
Tensor run(const Bf16ConvCase& c, const Tensor& x, const Conv2dWeights& w, const ChannelAffine* t,
           ConvAlgorithm algorithm, Compute& cx) {
  const Conv2dParams p = with(c.params, algorithm);
  const Shape shape = {c.out,
                       ops::conv2d_output_size(c.height, c.kernel, p.stride, p.pad_top,
                                               p.pad_bottom, p.upsample),
                       ops::conv2d_output_size(c.width, c.kernel, p.stride, p.pad_left,
                                               p.pad_right, p.upsample)};
  Tensor y = c.mode == ConvWrite::Accumulate ? random_tensor(shape, 99) : Tensor(shape);
  ops::conv2d_into(x, t, w, p, y, c.mode, cx);
  return y;
}

TEST_P(Conv2dBf16, MatchesExactPathAtVaeGeometries) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(2);
  double worst = 0;
  for (const Bf16ConvCase& c : kVaeCases) {
    if (!runs(GetParam(), c.params)) continue;
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor({c.in, c.height, c.width}, uint32_t(c.in + c.height));
    const Conv2dWeights w = random_conv(c.out, c.in, c.kernel, uint32_t(c.out), c.bias);
    const ChannelAffine t = random_affine(c.in, 5);
    const ChannelAffine* transform = c.transform ? &t : nullptr;
    const Tensor exact = run(c, x, w, transform, ConvAlgorithm::Gemm, cx);
    const Tensor tiles = run(c, x, w, transform, GetParam(), cx);
    ASSERT_EQ(exact.shape(), tiles.shape());
    const double diff = testing::scaled_diff(tiles.data(), exact.data(), exact.numel());
    std::cout << "  " << c.name << ": scaled diff " << diff << "\n";
    EXPECT_LE(diff, kBf16Bound);
    EXPECT_GT(diff, 0.0) << "bf16 rounding should show";
    worst = std::max(worst, diff);
  }
  std::cout << "  worst " << worst << "\n";
}

Conv2dParams upsample3() {
  Conv2dParams p = Conv2dParams::same(3);
  p.upsample = 3;
  return p;
}

// Small shapes with odd channel counts (a zero channel completes the last pair), K not a
// multiple of 32, output channels not a multiple of 16, and images narrower than a tile.
TEST_P(Conv2dBf16, MatchesDefinitionOnRoundedOperands) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(3);
  const Bf16ConvCase cases[] = {
      {"same3x3_odd", 5, 7, 13, 11, 3, same3x3(), true, true, ConvWrite::Overwrite},
      {"same3x3_wide", 19, 9, 6, 37, 3, same3x3(), false, true, ConvWrite::Overwrite},
      {"narrow", 6, 17, 9, 3, 3, same3x3(), true, true, ConvWrite::Overwrite},
      {"one_pixel", 4, 33, 1, 1, 3, same3x3(), true, false, ConvWrite::Overwrite},
      {"pointwise", 6, 4, 9, 7, 1, pointwise(), false, true, ConvWrite::Overwrite},
      {"pointwise_transform", 9, 40, 5, 13, 1, pointwise(), true, true, ConvWrite::Overwrite},
      {"downsample_even", 4, 6, 12, 10, 3, downsample(), true, true, ConvWrite::Overwrite},
      {"downsample_odd", 3, 5, 11, 9, 3, downsample(), false, true, ConvWrite::Overwrite},
      {"upsample", 5, 3, 7, 5, 3, upsample(), true, true, ConvWrite::Overwrite},
      {"upsample_wide", 7, 5, 3, 21, 3, upsample(), true, true, ConvWrite::Overwrite},
      {"upsample3", 5, 4, 4, 6, 3, upsample3(), true, true, ConvWrite::Overwrite},
      {"kernel5_stride3", 4, 3, 14, 17, 5, odd_params(), true, true, ConvWrite::Overwrite},
      {"channels_48", 48, 48, 10, 18, 3, same3x3(), true, true, ConvWrite::Overwrite},
  };
  double worst = 0;
  for (const Bf16ConvCase& c : cases) {
    if (!runs(GetParam(), c.params)) continue;
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor({c.in, c.height, c.width}, 7);
    const Conv2dWeights w = random_conv(c.out, c.in, c.kernel, 11, c.bias);
    const ChannelAffine t = random_affine(c.in, 21);
    const ChannelAffine* transform = c.transform ? &t : nullptr;
    const Tensor got =
        ops::conv2d(x, w, with(c.params, GetParam()), cx, transform);
    const Tensor ref = reference_conv(x, transform, w, c.params, true);
    ASSERT_EQ(got.shape(), ref.shape());
    const double diff = testing::scaled_diff(got.data(), ref.data(), ref.numel());
    EXPECT_LE(diff, kRoundedBound);
    worst = std::max(worst, diff);
  }
  std::cout << "  worst scaled diff " << worst << "\n";
}

// The fused GroupNorm + SiLU transform gives the values of ChannelAffine::apply rounded once to
// bf16, bit for bit: an identity 1x1 convolution (weights 1 and 0, no bias) returns them
// exactly. Inputs span +-200 so the exponential's clamping at 87 is reached.
TEST_P(Conv2dBf16, TransformedInputsAreRoundedExactly) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(2);
  const int64_t C = 34, H = 5, W = 37;
  Tensor x({C, H, W});
  const std::vector<float> v = random_values(x.numel(), 41, 60.0f);
  std::copy(v.begin(), v.end(), x.data());
  const ChannelAffine t = random_affine(C, 42);
  Conv2dWeights w;
  w.out_channels = w.in_channels = C;
  w.weight.assign(size_t(C * C), 0.0f);
  for (int64_t c = 0; c < C; ++c) w.weight[size_t(c * C + c)] = 1.0f;
  for (int64_t up : {1, 2}) {
    SCOPED_TRACE("upsample " + std::to_string(up));
    Conv2dParams p = with(pointwise(), GetParam());
    p.upsample = up;
    const Tensor y = ops::conv2d(x, w, p, cx, &t);
    ASSERT_EQ(y.shape(), (Shape{C, H * up, W * up}));
    int64_t mismatches = 0;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < H * up; ++i)
        for (int64_t j = 0; j < W * up; ++j) {
          float value = x.data()[(c * H + i / up) * W + j / up];
          t.apply(c, &value, &value, 1);
          const float expected = round_bf16(value), got = y.data()[(c * H * up + i) * W * up + j];
          if (std::memcmp(&expected, &got, sizeof(float)) != 0 && ++mismatches <= 5)
            ADD_FAILURE() << "channel " << c << " (" << i << ", " << j << "): " << got
                          << " != " << expected << " (from " << value << ")";
        }
    EXPECT_EQ(mismatches, 0);
  }
}

// Widths around the 16- and 32-pixel blocks and output channels around the 16- and 32-row
// blocks, on images of one and a few rows.
TEST_P(Conv2dBf16, BlockEdges) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(2);
  for (int64_t width : {1, 2, 15, 16, 17, 31, 32, 33, 47, 65, 100})
    for (int64_t out : {1, 3, 15, 16, 17, 31, 32, 33, 48, 50})
      for (int64_t height : {1, 3}) {
        SCOPED_TRACE("width " + std::to_string(width) + ", out " + std::to_string(out) +
                     ", height " + std::to_string(height));
        const Tensor x = random_tensor({3, height, width}, uint32_t(width));
        const Conv2dWeights w = random_conv(out, 3, 3, uint32_t(out));
        const Conv2dParams p = same3x3();
        const Tensor got = ops::conv2d(x, w, with(p, GetParam()), cx);
        const Tensor ref = reference_conv(x, nullptr, w, p, true);
        ASSERT_LE(testing::scaled_diff(got.data(), ref.data(), ref.numel()), kRoundedBound);
      }
}

// Accumulate adds onto what the output holds, bias included once.
TEST_P(Conv2dBf16, Accumulates) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(2);
  const Tensor x = random_tensor({6, 9, 10}, 1);
  for (int64_t kernel : {1, 3}) {
    SCOPED_TRACE("kernel " + std::to_string(kernel));
    const Conv2dWeights w = random_conv(20, 6, kernel, 2);
    const Conv2dParams p = with(Conv2dParams::same(kernel), GetParam());
    Tensor y = random_tensor({20, 9, 10}, 3);
    Tensor ref = reference_conv(x, nullptr, w, Conv2dParams::same(kernel), true);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.data()[i] += y.data()[i];
    ops::conv2d_into(x, nullptr, w, p, y, ConvWrite::Accumulate, cx);
    EXPECT_LE(testing::scaled_diff(y.data(), ref.data(), ref.numel()), kRoundedBound);
  }
}

// In place over several bands (8192 pixels each: 82 rows of 100 here), as the VAE's ResNets
// run conv2 when the channel count changes: same values as into a separate output.
TEST_P(Conv2dBf16, InPlaceOverManyBands) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  Compute cx(2);
  const int64_t C = 40, H = 200, W = 100;
  const Tensor x = random_tensor({C, H, W}, 4);
  const Conv2dWeights w = random_conv(24, C, 3, 5);
  const ChannelAffine t = random_affine(C, 6);
  const Conv2dParams p = with(same3x3(), GetParam());
  const Tensor ref = ops::conv2d(x, w, p, cx, &t);
  for (ConvWrite mode : {ConvWrite::Overwrite, ConvWrite::Accumulate}) {
    SCOPED_TRACE(mode == ConvWrite::Overwrite ? "overwrite" : "accumulate");
    Tensor work = copy_of(x);
    ops::conv2d({work.data(), C, H, W, &t}, w, p, work.data(), mode, cx);
    // The first 24 planes now hold the result (plus the input, accumulating).
    Tensor expected = copy_of(ref);
    if (mode == ConvWrite::Accumulate)
      for (int64_t i = 0; i < expected.numel(); ++i) expected.data()[i] += x.data()[i];
    EXPECT_EQ(testing::scaled_diff(work.data(), expected.data(), expected.numel()), 0.0);
  }
  const Tensor exact = ops::conv2d(x, w, with(same3x3(), ConvAlgorithm::Gemm), cx, &t);
  EXPECT_LE(testing::scaled_diff(ref.data(), exact.data(), ref.numel()), kBf16Bound);
}

TEST_P(Conv2dBf16, ResultsDoNotDependOnThreadCount) {
  KLEIN_REQUIRE_PATH(available(GetParam()), path_of(GetParam()),
                     "this CPU has no " << path_of(GetParam()) << " convolution kernel");
  const int64_t C = 40, H = 150, W = 70;  // two bands
  const Tensor x = random_tensor({C, H, W}, 13);
  const Conv2dWeights w = random_conv(24, C, 3, 14);
  const ChannelAffine t = random_affine(C, 15);
  Compute one(1), three(3);
  for (Conv2dParams p : {same3x3(), downsample(), upsample(), pointwise()}) {
    if (!runs(GetParam(), p)) continue;
    p.algorithm = GetParam();
    const Tensor a = ops::conv2d(x, w, p, one, &t);
    const Tensor b = ops::conv2d(x, w, p, three, &t);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)));
  }
}

// The context's arithmetic.fast_convolutions makes Auto use the tiles where they exist, else
// Winograd for the wide 3x3 layers, and the BF16 direct kernel (where it exists and is the
// faster: AMD) only for what Winograd does not take, such as conv_out's 3 output channels.
TEST(Conv2dBf16Auto, UsesBf16OnlyWhenAsked) {
  Compute cx(2);
  const Tensor x = random_tensor({20, 9, 30}, 16);
  const Conv2dWeights w = random_conv(18, 20, 3, 17), narrow = random_conv(3, 20, 3, 18);
  Conv2dParams p = same3x3();
  const Tensor exact = ops::conv2d(x, w, p, cx);
  const Tensor exact_narrow = ops::conv2d(x, narrow, p, cx);
  cx.arithmetic.fast_convolutions = true;
  const Tensor fast = ops::conv2d(x, w, p, cx);
  const Tensor fast_narrow = ops::conv2d(x, narrow, p, cx);
  const bool tiles = ops::conv2d_bf16_tiles_available();
  const Tensor expected =
      ops::conv2d(x, w, with(same3x3(), tiles ? ConvAlgorithm::Bf16Tiles : ConvAlgorithm::Winograd),
                  cx);
  const Tensor expected_narrow =
      tiles ? ops::conv2d(x, narrow, with(same3x3(), ConvAlgorithm::Bf16Tiles), cx)
      : ops::conv2d_bf16_auto_available()
          ? ops::conv2d(x, narrow, with(same3x3(), ConvAlgorithm::Bf16Direct), cx)
          : exact_narrow.copy();
  const auto bytes = [](const Tensor& t) { return size_t(t.numel()) * sizeof(float); };
  EXPECT_NE(0, std::memcmp(fast.data(), exact.data(), bytes(fast)));
  EXPECT_EQ(0, std::memcmp(fast.data(), expected.data(), bytes(fast)));
  EXPECT_EQ(0, std::memcmp(fast_narrow.data(), expected_narrow.data(), bytes(fast_narrow)));
  if (ops::conv2d_bf16_auto_available()) {
    EXPECT_NE(0, std::memcmp(fast_narrow.data(), exact_narrow.data(), bytes(fast_narrow)));
  }
  // An explicit algorithm wins over the flag.
  p.algorithm = ConvAlgorithm::Gemm;
  const Tensor gemm = ops::conv2d(x, w, p, cx);
  EXPECT_EQ(0, std::memcmp(gemm.data(), ops::conv2d(x, w, with(same3x3(), ConvAlgorithm::Gemm),
                                                    cx).data(),
                           bytes(gemm)));
}

INSTANTIATE_TEST_SUITE_P(Algorithms, Conv2dBf16,
                         ::testing::Values(ConvAlgorithm::Bf16Tiles, ConvAlgorithm::Bf16Direct),
                         [](const ::testing::TestParamInfo<ConvAlgorithm>& info) {
                           return info.param == ConvAlgorithm::Bf16Tiles ? "tiles" : "direct";
                         });

}  // namespace
}  // namespace klein
