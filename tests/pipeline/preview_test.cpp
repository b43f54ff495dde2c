// The step preview: the published FLUX.2 latent-to-RGB map, worked by hand for single
// channels, and the packing of 2x2 sub-positions per token.
#include <gtest/gtest.h>

#include "core/error.h"
#include "pipeline/preview.h"
#include "pipeline/tiny_decoder.h"

namespace klein {
namespace {

TEST(Preview, MapsEachSubPositionOfEachTokenToItsPixel) {
  // Two tokens side by side (a 1x2 grid): a 4x2 preview.
  Tensor tokens = Tensor::zeros({2, 128});
  // Token 0, channel 3 at sub-position (row 0, column 1): packed index 3·4 + 1.
  tokens.row(0)[3 * 4 + 1] = 1.0f;
  // Token 1, channel 8 at sub-position (row 1, column 0): packed index 8·4 + 2, weight 2.
  tokens.row(1)[8 * 4 + 2] = 2.0f;
  const Image image = latent_preview(tokens, {1, 2});
  ASSERT_EQ(image.width, 4);
  ASSERT_EQ(image.height, 2);
  auto expect = [&](int x, int y, int r, int g, int b) {
    const uint8_t* p = image.pixel(x, y);
    EXPECT_EQ(p[0], r) << x << "," << y;
    EXPECT_EQ(p[1], g) << x << "," << y;
    EXPECT_EQ(p[2], b) << x << "," << y;
  };
  // Zero latents: the bias (-0.0329, -0.0718, -0.0851) mapped from [-1, 1] to [0, 255].
  expect(0, 0, 123, 118, 117);
  expect(3, 1, 123, 118, 117);
  // Channel 3 (0.2144, 0.3009, 0.3652) plus the bias: 0.1815, 0.2291, 0.2801.
  expect(1, 0, 151, 157, 163);
  // 2 x channel 8 (-0.3527, -0.2712, -0.1666) plus the bias: -0.7383, -0.6142, -0.4183.
  expect(2, 1, 33, 49, 74);
}

TEST(Preview, EstimatesTheCleanLatentsFromTheStep) {
  Tensor x = Tensor::zeros({1, 128}), v = Tensor::zeros({1, 128});
  x.row(0)[3 * 4] = 0.5f;    // x0 = 0.5 − 0.25 · (−2) = 1 at channel 3, sub-position 0
  v.row(0)[3 * 4] = -2.0f;
  const Image image = step_preview(x, v, 0.25f, {1, 1});
  EXPECT_EQ(image.pixel(0, 0)[0], 151);
  EXPECT_THROW(latent_preview(Tensor({3, 128}), {1, 2}), Error);
}

}  // namespace
}  // namespace klein

namespace klein::tiny_preview_test {

// The tiny decoder's preview input: whole k x k cells averaged, k the least factor that brings
// 8 · the longest side to the size asked; cells past a multiple of k left out.
TEST(TinyPreview, AveragesWholeCellsToTheSizeAsked) {
  Tensor z({2, 4, 7});  // 7 cells wide: 56 pixels
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = float(i);
  // 16 pixels: 2 cells a side at most, k = 4: one row of one cell (4x4 of the 4x7; the last
  // three columns left out).
  const Tensor p = pool_latents_for_preview(z, 16);
  ASSERT_EQ(p.shape(), (Shape{2, 1, 1}));
  // Channel 0: rows 0..3, columns 0..3 of 7i + j: mean 7 · 1.5 + 1.5 = 12.
  EXPECT_FLOAT_EQ(p.data()[0], 12.0f);
  EXPECT_FLOAT_EQ(p.data()[1], 28.0f + 12.0f);  // channel 1 is 28 more
  // 32 pixels: 4 cells, k = 2: 2x3 cells of 2x2.
  const Tensor q = pool_latents_for_preview(z, 32);
  ASSERT_EQ(q.shape(), (Shape{2, 2, 3}));
  EXPECT_FLOAT_EQ(q.data()[0], (0 + 1 + 7 + 8) / 4.0f);
  EXPECT_FLOAT_EQ(q.data()[5], (18 + 19 + 25 + 26) / 4.0f);  // row 1, column 2
  // Large enough: the latents as they are.
  const Tensor same = pool_latents_for_preview(z, 56);
  ASSERT_EQ(same.shape(), z.shape());
  for (int64_t i = 0; i < z.numel(); ++i) EXPECT_EQ(same.data()[i], z.data()[i]);
  EXPECT_THROW(pool_latents_for_preview(Tensor({4, 7}), 16), Error);
}

}  // namespace klein::tiny_preview_test
