// The convolution and GroupNorm kernels against direct loops over the definitions.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "ops/conv2d.h"
#include "ops/group_norm.h"
#include "ops/group_norm_kernels.h"
#include "support/conv_reference.h"
#include "support/testing.h"
#include "support/isa.h"

namespace klein {
namespace {

using ops::ChannelAffine;
using ops::Conv2dParams;
using ops::Conv2dWeights;
using ops::ConvWrite;

using testing::odd_params;
using testing::random_conv;
using testing::random_tensor;
using testing::random_values;
using testing::reference_conv;

double max_scaled_diff(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.shape(), ref.shape());
  return testing::scaled_diff(got.data(), ref.data(), ref.numel());
}

struct ConvCase {
  const char* name;
  int64_t in, out, height, width, kernel;
  Conv2dParams params;
};

Conv2dParams downsample_params() {  // the VAE's: zero row/column on the bottom/right only
  Conv2dParams p;
  p.stride = 2;
  p.pad_bottom = p.pad_right = 1;
  return p;
}

Conv2dParams upsample_params() {
  Conv2dParams p = Conv2dParams::same(3);
  p.upsample = 2;
  return p;
}

const ConvCase kCases[] = {
    {"same3x3_odd_sizes", 5, 7, 13, 11, 3, Conv2dParams::same(3)},
    {"same3x3_wide", 19, 9, 6, 37, 3, Conv2dParams::same(3)},
    {"pointwise", 6, 4, 9, 7, 1, Conv2dParams{}},
    {"downsample_even", 4, 6, 12, 10, 3, downsample_params()},
    {"downsample_odd", 3, 5, 11, 9, 3, downsample_params()},
    {"upsample", 5, 3, 7, 5, 3, upsample_params()},
    {"kernel5_stride3_asymmetric", 4, 3, 14, 17, 5, odd_params()},
};

// The algorithms that can run this case here: im2col + GEMM always, the direct kernel for
// stride 1 on CPUs that have it.
std::vector<ops::ConvAlgorithm> algorithms_for(const Conv2dParams& p) {
  std::vector<ops::ConvAlgorithm> a = {ops::ConvAlgorithm::Gemm};
  if (p.stride == 1 && ops::conv2d_direct_available()) a.push_back(ops::ConvAlgorithm::Direct);
  return a;
}

const char* name_of(ops::ConvAlgorithm a) {
  return a == ops::ConvAlgorithm::Gemm     ? "gemm"
         : a == ops::ConvAlgorithm::Direct ? "direct"
                                           : "auto";
}

ChannelAffine random_affine(int64_t channels, bool silu) {
  ChannelAffine a;
  a.mean = random_values(channels, 21);
  a.scale = random_values(channels, 22);
  a.shift = random_values(channels, 23);
  a.silu = silu;
  return a;
}

// Every case with every algorithm that takes it against the definition, with or without a
// fused GroupNorm + SiLU transform of the input.
void expect_cases_match_definition(bool transform, uint32_t seed) {
  Compute cx(transform ? 2 : 3);
  for (const ConvCase& c : kCases)
    for (ops::ConvAlgorithm a : algorithms_for(c.params)) {
      SCOPED_TRACE(std::string(c.name) + " " + name_of(a));
      Tensor x = random_tensor({c.in, c.height, c.width}, seed);
      Conv2dWeights w = random_conv(c.out, c.in, c.kernel, seed + 4);
      const ChannelAffine t = random_affine(c.in, true);
      const ChannelAffine* tp = transform ? &t : nullptr;
      Conv2dParams p = c.params;
      p.algorithm = a;
      Tensor got = ops::conv2d(x, w, p, cx, tp);
      EXPECT_LE(max_scaled_diff(got, reference_conv(x, tp, w, c.params)), 1e-6);
    }
}

TEST(Conv2d, MatchesDefinition) { expect_cases_match_definition(false, 7); }

TEST(Conv2d, FusedTransformMatchesDefinition) { expect_cases_match_definition(true, 8); }

// Widths that are not multiples of the kernel's vector blocks, channel counts that are not
// multiples of its channel groups, one-row images.
TEST(Conv2d, DirectKernelEdges) {
  KLEIN_REQUIRE_PATH(ops::conv2d_direct_available(), "avx512",
                     "the direct convolution kernel needs AVX-512");
  Compute cx(2);
  for (int64_t width : {1, 15, 16, 17, 95, 96, 97, 193, 250})
    for (int64_t out : {1, 3, 4, 5, 9}) {
      SCOPED_TRACE("width " + std::to_string(width) + ", out " + std::to_string(out));
      Tensor x = random_tensor({3, 2, width}, uint32_t(width));
      Conv2dWeights w = random_conv(out, 3, 3, uint32_t(out));
      Conv2dParams p = Conv2dParams::same(3);
      p.algorithm = ops::ConvAlgorithm::Direct;
      EXPECT_LE(max_scaled_diff(ops::conv2d(x, w, p, cx), reference_conv(x, nullptr, w, p)), 1e-6);
    }
}

TEST(Conv2d, AccumulatesIntoOutput) {
  Compute cx(2);
  Tensor x = random_tensor({6, 9, 10}, 1);
  for (int64_t kernel : {1, 3}) {
    Conv2dWeights w = random_conv(4, 6, kernel, 2);
    Conv2dParams p = Conv2dParams::same(kernel);
    Tensor y = random_tensor({4, 9, 10}, 3);
    Tensor ref = reference_conv(x, nullptr, w, p);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.data()[i] += y.data()[i];
    ops::conv2d_into(x, nullptr, w, p, y, ConvWrite::Accumulate, cx);
    EXPECT_LE(max_scaled_diff(y, ref), 1e-6) << "kernel " << kernel;
  }
}

// Bands hold 8192 output pixels (82 rows of 100 here) and GEMM tiles 512, so this covers
// several bands and tiles that straddle rows.
TEST(Conv2d, InPlaceOverManyBands) {
  Compute cx(2);
  const int64_t C = 16, H = 200, W = 100;
  Tensor x = random_tensor({C, H, W}, 4);
  Conv2dWeights w = random_conv(8, C, 3, 5);
  ChannelAffine t = random_affine(C, true);
  for (ops::ConvAlgorithm a : algorithms_for(Conv2dParams::same(3))) {
    SCOPED_TRACE(name_of(a));
    Conv2dParams p = Conv2dParams::same(3);
    p.algorithm = a;
    Tensor work({C, H, W});  // a copy of x to convolve in place
    std::memcpy(work.data(), x.data(), size_t(x.numel()) * sizeof(float));
    Tensor ref = ops::conv2d(x, w, p, cx, &t);
    ops::conv2d({work.data(), C, H, W, &t}, w, p, work.data(), ConvWrite::Overwrite, cx);
    // The first 8 planes now hold the result.
    EXPECT_EQ(testing::scaled_diff(work.data(), ref.data(), ref.numel()), 0.0);
  }
}

TEST(Conv2d, ManyBandsMatchDefinition) {
  Compute cx(2);
  const int64_t C = 8, H = 100, W = 50;  // upsampled to 200 x 100: three bands
  Tensor x = random_tensor({C, H, W}, 9);
  Conv2dWeights w = random_conv(3, C, 3, 10);
  Tensor ref = reference_conv(x, nullptr, w, upsample_params());
  for (ops::ConvAlgorithm a : algorithms_for(upsample_params())) {
    SCOPED_TRACE(name_of(a));
    Conv2dParams p = upsample_params();
    p.algorithm = a;
    EXPECT_LE(max_scaled_diff(ops::conv2d(x, w, p, cx), ref), 1e-6);
  }
}

// Conv2dParams::origin_row: rows of a large output computed by calls that each see only the
// input rows a band reads (the VAE's banded decoder) are bit for bit the whole call's, with
// every algorithm this CPU has. Bands of one and two of the convolution's own bands; the
// images span several of them (100 columns: 84 rows per band), and a 1x1 convolution's tiles
// of 512 pixels straddle rows.
TEST(Conv2d, BandsWithOriginRowAreBitIdentical) {
  Compute cx(2);
  struct Case {
    const char* name;
    int64_t in, out, height, width, kernel, upsample;
  };
  const Case cases[] = {{"same3x3", 16, 8, 200, 100, 3, 1},
                        {"upsample", 8, 6, 100, 50, 3, 2},
                        {"pointwise", 24, 16, 200, 100, 1, 1}};
  for (const Case& c : cases) {
    Conv2dParams base = c.kernel == 3 ? Conv2dParams::same(3) : Conv2dParams{};
    base.upsample = c.upsample;
    std::vector<ops::ConvAlgorithm> algorithms = algorithms_for(base);
    // The bf16 kernels where this CPU has them (logged for the run's ISA summary).
    klein::testing::log_isa_path(ops::conv2d_bf16_tiles_available() ? "ran" : "skipped", "amx");
    klein::testing::log_isa_path(ops::conv2d_bf16_direct_available() ? "ran" : "skipped",
                                 "avx512-bf16");
    if (ops::conv2d_bf16_tiles_available()) algorithms.push_back(ops::ConvAlgorithm::Bf16Tiles);
    if (ops::conv2d_bf16_direct_available()) algorithms.push_back(ops::ConvAlgorithm::Bf16Direct);
    if (c.kernel == 3) algorithms.push_back(ops::ConvAlgorithm::Winograd);
    const Tensor x = random_tensor({c.in, c.height, c.width}, 31);
    const Conv2dWeights w = random_conv(c.out, c.in, c.kernel, 32);
    const ChannelAffine t = random_affine(c.in, true);
    const ChannelAffine* tp = c.kernel == 3 ? &t : nullptr;
    const int64_t H = c.height * c.upsample, W = c.width * c.upsample;
    const int64_t tile = ops::conv2d_tile_pixels();
    for (ops::ConvAlgorithm a : algorithms)
      for (int64_t multiple : {1, 2}) {
        SCOPED_TRACE(std::string(c.name) + " algorithm " + std::to_string(int(a)) + " bands of " +
                     std::to_string(multiple));
        Conv2dParams p = base;
        p.algorithm = a;
        const Tensor whole = ops::conv2d(x, w, p, cx, tp);
        const int64_t band = multiple * ops::conv2d_band_rows(W);
        ASSERT_LT(band, H);
        for (int64_t r0 = 0; r0 < H; r0 += band) {
          const int64_t r1 = std::min(H, r0 + band);
          int64_t y0 = r0 == 0 ? 0 : (r0 - 1) / c.upsample;  // input rows [y0, y1)
          int64_t y1 = std::min(c.height, r1 / c.upsample + 1);
          if (c.kernel == 1) {  // whole tiles of pixels
            y0 = r0 * W / tile * tile / W;
            y1 = std::min(H, ((r1 * W + tile - 1) / tile * tile + W - 1) / W);
          }
          Tensor rows({c.in, y1 - y0, c.width});
          for (int64_t ch = 0; ch < c.in; ++ch)
            std::memcpy(rows.data() + ch * (y1 - y0) * c.width,
                        x.data() + (ch * c.height + y0) * c.width,
                        size_t((y1 - y0) * c.width) * sizeof(float));
          p.origin_row = y0 * c.upsample;
          const Tensor part = ops::conv2d(rows, w, p, cx, tp);
          for (int64_t o = 0; o < c.out; ++o)
            ASSERT_EQ(0, std::memcmp(part.data() + (o * part.dim(1) + r0 - p.origin_row) * W,
                                     whole.data() + (o * H + r0) * W,
                                     size_t((r1 - r0) * W) * sizeof(float)))
                << "output channel " << o << ", rows [" << r0 << ", " << r1 << ")";
          if (c.kernel == 1) continue;
          // The rows around [r0, r1) skipped: the same bits in the kept rows, and the others
          // not written.
          Conv2dParams q = p;
          q.skip_top = r0 - p.origin_row;
          q.skip_bottom = part.dim(1) - (r1 - p.origin_row);
          const float untouched = -7.25f;
          std::vector<float> skipped(size_t(part.numel()), untouched);
          ops::conv2d({rows.data(), c.in, y1 - y0, c.width, tp}, w, q, skipped.data(),
                      ops::ConvWrite::Overwrite, cx);
          for (int64_t o = 0; o < c.out; ++o) {
            const float* got = skipped.data() + o * part.dim(1) * W;
            ASSERT_EQ(0, std::memcmp(got + q.skip_top * W, whole.data() + (o * H + r0) * W,
                                     size_t((r1 - r0) * W) * sizeof(float)))
                << "skipping: output channel " << o << ", rows [" << r0 << ", " << r1 << ")";
            for (int64_t i = 0; i < part.dim(1) * W; ++i) {
              if (i < q.skip_top * W || i >= (part.dim(1) - q.skip_bottom) * W) {
                ASSERT_EQ(got[i], untouched) << "skipping: output channel " << o
                                             << " wrote local row " << i / W;
              }
            }
          }
        }
      }
  }
}

TEST(Conv2d, ResultsDoNotDependOnThreadCount) {
  const int64_t C = 40, H = 150, W = 70;  // two bands
  Tensor x = random_tensor({C, H, W}, 13);
  Conv2dWeights w = random_conv(24, C, 3, 14);
  ChannelAffine t = random_affine(C, true);
  Compute one(1), three(3);
  for (Conv2dParams p : {Conv2dParams::same(3), downsample_params(), upsample_params()})
    for (ops::ConvAlgorithm algorithm : algorithms_for(p)) {
      p.algorithm = algorithm;
      Tensor a = ops::conv2d(x, w, p, one, &t);
      Tensor b = ops::conv2d(x, w, p, three, &t);
      ASSERT_EQ(a.shape(), b.shape());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)));
    }
}

// The two algorithms at the channel counts of the real VAE (512 channels: K = 4608).
TEST(Conv2d, AlgorithmsAgreeAtVaeShapes) {
  KLEIN_REQUIRE_PATH(ops::conv2d_direct_available(), "avx512",
                     "the direct convolution kernel needs AVX-512");
  Compute cx(2);
  const int64_t shapes[][2] = {{512, 512}, {256, 128}, {128, 3}};
  for (const auto& [in, out] : shapes) {
    SCOPED_TRACE(std::to_string(in) + " -> " + std::to_string(out));
    Tensor x = random_tensor({in, 12, 21}, uint32_t(in));
    Conv2dWeights w = random_conv(out, in, 3, uint32_t(out));
    ChannelAffine t = random_affine(in, true);
    Conv2dParams gemm = Conv2dParams::same(3), direct = gemm;
    gemm.algorithm = ops::ConvAlgorithm::Gemm;
    direct.algorithm = ops::ConvAlgorithm::Direct;
    // Sums of up to 4608 products in different orders: a few float32 ulps apart.
    EXPECT_LE(max_scaled_diff(ops::conv2d(x, w, direct, cx, &t), ops::conv2d(x, w, gemm, cx, &t)),
              2e-5);
  }
}

TEST(Conv2d, RejectsMismatchedInput) {
  Compute cx(1);
  Tensor x = random_tensor({3, 8, 8}, 1);
  EXPECT_THROW(ops::conv2d(x, random_conv(4, 5, 3, 1), Conv2dParams::same(3), cx), Error);
  Tensor tiny = random_tensor({3, 2, 2}, 1);
  EXPECT_THROW(ops::conv2d(tiny, random_conv(4, 3, 5, 1), Conv2dParams{}, cx), Error);
}

// The SiLU's own exponential against the exact value over the whole float range that matters.
// The row transform's copies per instruction set (group_norm_kernels.h) give the baseline's
// bits, SiLU and plain, over a sweep and the special values.
// The row transform of every instruction set gives the baseline's bits: one test per compiled
// ISA, SKIPPED (and logged) where this CPU lacks it, so a run without AVX-512 says so instead of
// passing with nothing compared.
class GroupNormRows : public klein::testing::OnEveryIsa {};

TEST_P(GroupNormRows, TransformIsTheBaselinesBitForBit) {
  std::vector<float> x;
  for (float v = -130.0f; v <= 130.0f; v += 0.0173f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-38f, 1e-44f, 3e38f, -3e38f, INFINITY, -INFINITY,
                  std::nanf("")})
    x.push_back(v);
  const auto baseline = ops::detail::affine_kernel_baseline();
  const auto kernel = ops::detail::affine_kernel(isa());
  ASSERT_NE(kernel, nullptr);
#if defined(KLEIN_X86)
  // The vector ISAs have copies of their own: comparing the baseline with itself is no test.
  if (isa() != quant::Isa::Scalar) {
    EXPECT_NE(kernel, baseline);
  }
#endif
  int64_t compared = 0;
  for (bool silu : {true, false})
    for (auto [m, s, b] : {std::array<float, 3>{0.0f, 1.0f, 0.0f}, {0.31f, 1.7f, -0.45f}}) {
      std::vector<float> want(x.size()), got(x.size());
      baseline(m, s, b, silu, x.data(), want.data(), int64_t(x.size()));
      kernel(m, s, b, silu, x.data(), got.data(), int64_t(x.size()));
      for (size_t i = 0; i < x.size(); ++i, ++compared)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
            << "x = " << x[i] << ", silu " << silu << ", m " << m;
    }
  EXPECT_EQ(compared, 4 * int64_t(x.size()));
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(GroupNormRows);

TEST(GroupNorm, SiluIsAccurate) {
  Compute cx(1);
  ChannelAffine identity;
  identity.mean = {0.0f};
  identity.scale = {1.0f};
  identity.shift = {0.0f};
  identity.silu = true;
  std::vector<float> x;
  for (float v = -120.0f; v <= 120.0f; v += 0.0137f) x.push_back(v);
  x.push_back(0.0f);
  x.push_back(1e-30f);
  std::vector<float> y(x.size());
  identity.apply(0, x.data(), y.data(), int64_t(x.size()));
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = x[i] / (1.0 + std::exp(-double(x[i])));
    if (std::fabs(ref) < 1e-30) {
      EXPECT_LE(std::fabs(y[i]), 1e-30) << x[i];
      continue;
    }
    worst = std::max(worst, std::fabs(y[i] - ref) / std::fabs(ref));
  }
  EXPECT_LE(worst, 1e-6);
  float nan = std::nanf("");
  identity.apply(0, &nan, &nan, 1);
  EXPECT_TRUE(std::isnan(nan));
}

// GroupNorm by its definition, in double.
TEST(GroupNorm, MatchesDefinition) {
  Compute cx(3);
  const int64_t C = 12, P = 257, G = 4;
  std::vector<float> x = random_values(C * P, 31, 3.0f);
  for (float& v : x) v += 5.0f;  // a mean far from zero
  std::vector<float> gamma = random_values(C, 32), beta = random_values(C, 33);
  ChannelAffine a =
      ops::group_norm_affine(x.data(), C, P, G, gamma.data(), beta.data(), 1e-6f, true, cx);
  std::vector<float> y(x.size());
  ops::apply_channel_affine(x.data(), y.data(), C, P, a, cx);
  const int64_t n = C / G * P;
  double worst = 0;
  for (int64_t g = 0; g < G; ++g) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; ++i) mean += x[size_t(g * n + i)];
    mean /= double(n);
    for (int64_t i = 0; i < n; ++i) var += std::pow(x[size_t(g * n + i)] - mean, 2);
    var /= double(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t c = (g * n + i) / P;
      double v = (x[size_t(g * n + i)] - mean) / std::sqrt(var + 1e-6) * gamma[size_t(c)] +
                 beta[size_t(c)];
      v = v / (1 + std::exp(-v));
      worst = std::max(worst, std::fabs(v - y[size_t(g * n + i)]));
    }
  }
  EXPECT_LE(worst, 1e-5);
}

}  // namespace
}  // namespace klein
