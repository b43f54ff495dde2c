// ConvAlgorithm::Winograd (F(4x4, 3x3) in float32, ops/conv2d_winograd.h) on every compiled
// instruction set, against the definition summed in double (small channel counts) or the exact
// float32 GEMM path (klein's channel counts, where the definition would take seconds; that
// path is within 1e-6 of it, tests/ops/ops_test.cpp).
//
// Error: the transforms multiply inputs by up to 5 and outputs by up to 8 before terms
// cancel, so float32 rounding of the transformed values is amplified by about a hundred over
// the direct sums. Measured here (scaled difference max|winograd - definition| / max|def|):
// see the printed values, about 1e-6 to 1e-5 on random data; the bound is kWinogradBound.
// The exact paths stay within 1e-6 on the same cases.
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>

#include "ops/conv2d.h"
#include "ops/group_norm.h"
#include "support/conv_reference.h"
#include "support/isa.h"
#include "support/testing.h"

namespace klein {
namespace {

using ops::ChannelAffine;
using ops::Conv2dParams;
using ops::Conv2dWeights;
using ops::ConvAlgorithm;
using ops::ConvWrite;
using testing::random_affine;
using testing::random_conv;
using testing::random_tensor;
using testing::reference_conv;

constexpr double kWinogradBound = 5e-5;

bool identical(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)) == 0;
}

Conv2dParams winograd(int64_t upsample = 1) {
  Conv2dParams p = Conv2dParams::same(3);
  p.upsample = upsample;
  p.algorithm = ConvAlgorithm::Winograd;
  return p;
}

struct WinogradCase {
  const char* name;
  int64_t in, out, height, width;
  Conv2dParams params;
  bool transform, bias;
  ConvWrite mode;
};

class Conv2dWinograd : public testing::OnEveryIsa {};

// The VAE's 3x3 geometries at klein's channel counts on small images, and the edges: sides
// that are not multiples of 4 (partial tiles) or of a vector of tiles, images narrower than
// one tile, one pixel, odd channel counts, no bias, accumulation, asymmetric padding.
TEST_P(Conv2dWinograd, MatchesDefinition) {
  Compute cx(3, isa());
  Conv2dParams asymmetric = winograd();
  asymmetric.pad_top = 0;
  asymmetric.pad_bottom = 2;
  asymmetric.pad_left = 2;
  asymmetric.pad_right = 0;
  const WinogradCase cases[] = {
      {"resnet_512", 512, 512, 12, 21, winograd(), true, true, ConvWrite::Overwrite},
      {"resnet_512_to_256", 512, 256, 11, 19, winograd(), true, true, ConvWrite::Accumulate},
      {"resnet_256_to_128", 256, 128, 13, 35, winograd(), true, true, ConvWrite::Overwrite},
      {"resnet_128", 128, 128, 17, 70, winograd(), true, true, ConvWrite::Accumulate},
      {"decoder_conv_in", 32, 512, 5, 7, winograd(), false, true, ConvWrite::Overwrite},
      {"upsampler_512", 512, 512, 6, 9, winograd(2), false, true, ConvWrite::Overwrite},
      {"upsampler_256", 256, 256, 7, 11, winograd(2), false, true, ConvWrite::Overwrite},
      {"odd_channels", 5, 7, 13, 11, winograd(), true, true, ConvWrite::Overwrite},
      {"narrow", 6, 17, 9, 3, winograd(), true, true, ConvWrite::Overwrite},
      {"one_pixel", 4, 33, 1, 1, winograd(), true, false, ConvWrite::Overwrite},
      {"wide", 19, 9, 6, 133, winograd(), false, true, ConvWrite::Overwrite},
      {"upsample3", 5, 4, 4, 6, winograd(3), true, true, ConvWrite::Overwrite},
      {"asymmetric_padding", 20, 18, 10, 26, asymmetric, true, true, ConvWrite::Overwrite},
  };
  double worst = 0;
  for (const WinogradCase& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor x = random_tensor({c.in, c.height, c.width}, uint32_t(c.in + c.width));
    const Conv2dWeights w = random_conv(c.out, c.in, 3, uint32_t(c.out + 1), c.bias);
    const ChannelAffine t = random_affine(c.in, 3);
    const ChannelAffine* transform = c.transform ? &t : nullptr;
    Conv2dParams exact = c.params;
    exact.algorithm = ConvAlgorithm::Gemm;
    const Tensor expected = c.in * c.out > 1024 ? ops::conv2d(x, w, exact, cx, transform)
                                                : reference_conv(x, transform, w, c.params);
    const Tensor start = random_tensor(expected.shape(), 99);
    Tensor y = c.mode == ConvWrite::Accumulate ? start.copy() : Tensor(expected.shape());
    ops::conv2d_into(x, transform, w, c.params, y, c.mode, cx);
    if (c.mode == ConvWrite::Accumulate) {
      // Compare the convolution's part: subtract what was there.
      for (int64_t i = 0; i < y.numel(); ++i) y.data()[i] -= start.data()[i];
    }
    const double diff = testing::scaled_diff(y.data(), expected.data(), expected.numel());
    std::cout << "  " << c.name << ": scaled diff " << diff << "\n";
    EXPECT_LE(diff, kWinogradBound);
    worst = std::max(worst, diff);
  }
  std::cout << "  worst " << worst << "\n";
}

// Several bands (conv2d_band_rows(600) = 16), the last one of 13 rows (a partial row of tiles).
// The result does not depend on the thread count, in place equals out of place, and each
// matches the definition. With 32 threads a chunk's 108 GEMM tasks (36 points x 3 column
// ranges) are under 6 a thread, so the 16 output channels are split into two ranges of
// whole kernel row blocks as well.
TEST_P(Conv2dWinograd, BandsThreadsAndInPlace) {
  const int64_t C = 24, Cout = 16, H = 45, W = 600;
  ASSERT_EQ(ops::conv2d_band_rows(W), 16);
  const Tensor x = random_tensor({C, H, W}, 41);
  const Conv2dWeights w = random_conv(Cout, C, 3, 42);
  const ChannelAffine t = random_affine(C, 43);
  Compute one(1, isa()), three(3, isa()), many(32, isa());
  const Tensor a = ops::conv2d(x, w, winograd(), one, &t);
  const Tensor b = ops::conv2d(x, w, winograd(), three, &t);
  EXPECT_TRUE(identical(a, b));
  EXPECT_TRUE(identical(a, ops::conv2d(x, w, winograd(), many, &t)));
  Conv2dParams exact = winograd();
  exact.algorithm = ConvAlgorithm::Gemm;
  const Tensor expected = ops::conv2d(x, w, exact, three, &t);
  EXPECT_LE(testing::scaled_diff(a.data(), expected.data(), expected.numel()), kWinogradBound);
  for (ConvWrite mode : {ConvWrite::Overwrite, ConvWrite::Accumulate}) {
    SCOPED_TRACE(mode == ConvWrite::Overwrite ? "overwrite" : "accumulate");
    Tensor work = x.copy();
    ops::conv2d({work.data(), C, H, W, &t}, w, winograd(), work.data(), mode, three);
    Tensor want = a.copy();
    if (mode == ConvWrite::Accumulate)
      for (int64_t i = 0; i < want.numel(); ++i) want.data()[i] += x.data()[i];
    EXPECT_EQ(0, std::memcmp(work.data(), want.data(), size_t(want.numel()) * sizeof(float)));
  }
}

// Only 3x3 stride-1 kernels have a Winograd form: asking for it elsewhere is an error.
TEST_P(Conv2dWinograd, RefusesOtherGeometries) {
  Compute cx(1, isa());
  const Tensor x = random_tensor({16, 8, 8}, 1);
  Conv2dParams strided = winograd();
  strided.stride = 2;
  EXPECT_THROW(ops::conv2d(x, random_conv(16, 16, 3, 2), strided, cx), Error);
  Conv2dParams pointwise;
  pointwise.algorithm = ConvAlgorithm::Winograd;
  EXPECT_THROW(ops::conv2d(x, random_conv(16, 16, 1, 2), pointwise, cx), Error);
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(Conv2dWinograd);

// Auto with fast convolutions: Winograd for wide 3x3 stride-1 layers on a CPU without fast
// bf16 products (here: the AVX2 or NEON path, or the portable one), the exact kernels for
// narrow ones (conv_out's 3 output channels) and without the flag.
TEST(Conv2dWinogradAuto, TakenForWideLayersWhenAsked) {
  const quant::Isa isa = quant::isa_available(quant::Isa::Avx2) ? quant::Isa::Avx2
                         : quant::isa_available(quant::Isa::Neon) ? quant::Isa::Neon
                                                                  : quant::Isa::Scalar;
  Compute cx(2, isa);
  const Tensor x = random_tensor({20, 9, 30}, 16);
  const Conv2dWeights wide = random_conv(18, 20, 3, 17), narrow = random_conv(3, 20, 3, 18);
  const Conv2dParams p = Conv2dParams::same(3);
  const Tensor exact = ops::conv2d(x, wide, p, cx);
  const Tensor exact_narrow = ops::conv2d(x, narrow, p, cx);
  cx.arithmetic.fast_convolutions = true;
  const Tensor fast = ops::conv2d(x, wide, p, cx);
  EXPECT_TRUE(identical(fast, ops::conv2d(x, wide, winograd(), cx)));
  EXPECT_FALSE(identical(fast, exact));
  EXPECT_TRUE(identical(ops::conv2d(x, narrow, p, cx), exact_narrow));
}

}  // namespace
}  // namespace klein
