// Pixels into and out of the model, against the official pipeline's values in klein-tiny.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"
#include "image/image_helpers.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using testing::solid_image;

TEST(ReferencePreprocessing, ReproducesThePipelinePixels) {
  const fs::path ref = testing::tiny_vectors() / "inputs" / "ref0.png";
  const Image prepared = prepare_reference(load_image(ref), ref.string());
  // 88x72 floors to 80x64 by cutting 4 pixels on every side.
  EXPECT_EQ(prepared.width, 80);
  EXPECT_EQ(prepared.height, 64);
  const Tensor pixels = image_to_tensor(prepared);
  EXPECT_EQ(pixels.shape(), (Shape{3, 64, 80}));
  const fs::path want = testing::tiny_vectors() / "vae" / "encode_ref0" / "ref0_pixels.npy";
  EXPECT_TRUE(testing::matches_npy(pixels, want, 1e-6));
  EXPECT_TRUE(testing::matches_npy(load_reference(ref), want, 1e-6));
}

TEST(ReferencePreprocessing, CropsEvenlyWithTheOddPixelRightAndBelow) {
  Image image = testing::pattern_image(100, 75);
  const Image cropped = center_crop_to_multiple(image, 16);  // 96x64: excess 4 and 11
  ASSERT_EQ(cropped.width, 96);
  ASSERT_EQ(cropped.height, 64);
  EXPECT_EQ(cropped.pixel(0, 0)[0], image.pixel(2, 5)[0]);
  EXPECT_EQ(cropped.pixel(95, 63)[2], image.pixel(97, 68)[2]);
  EXPECT_EQ(center_crop_to_multiple(cropped, 16).rgb, cropped.rgb);
}

// Python's floor division places the window: a larger target reaches one pixel further left
// and up on an odd difference, and what lies outside the image is black (PIL's crop).
TEST(InitImagePreprocessing, CropCentredPadsBlackOutsideTheImage) {
  const Image image = testing::solid_image(5, 6, 200, 100, 50);
  const Image out = crop_centered(image, 8, 9);  // left = floor(-3 / 2) = -2, top = -2
  ASSERT_EQ(out.width, 8);
  ASSERT_EQ(out.height, 9);
  EXPECT_EQ(out.pixel(1, 1)[0], 0);
  EXPECT_EQ(out.pixel(2, 2)[0], 200);
  EXPECT_EQ(out.pixel(6, 7)[1], 100);
  EXPECT_EQ(out.pixel(7, 8)[2], 0);
  const Image pattern = testing::pattern_image(100, 90);
  const Image inner = crop_centered(pattern, 96, 80);  // the golden case: left 2, top 5
  EXPECT_EQ(inner.pixel(0, 0)[0], pattern.pixel(2, 5)[0]);
  EXPECT_EQ(inner.pixel(95, 79)[2], pattern.pixel(97, 84)[2]);
}

// The mask processor's reading: grey >= 128 is white (1); bilinear to the latent grid samples
// between pixels 7 and 8 of each 16-pixel cell, so a boundary inside a cell gives a fraction.
TEST(InpaintingMask, BinarizedThenBilinearOnTheLatentGrid) {
  Image image = testing::solid_image(32, 16, 0, 0, 0);
  for (int y = 0; y < 16; ++y)
    for (int x = 8; x < 32; ++x) {
      uint8_t* p = image.pixel(x, y);
      p[0] = p[1] = p[2] = x < 24 ? 128 : 255;  // 128 is already white
    }
  image.pixel(0, 0)[0] = 255;  // grey 76 (red alone): still black
  const std::vector<float> mask = binary_mask(image, 32, 16);
  EXPECT_EQ(mask[0], 0.0f);
  EXPECT_EQ(mask[7], 0.0f);
  EXPECT_EQ(mask[8], 1.0f);
  const std::vector<float> cells = resample_bilinear(mask, 16, 32, 1, 2);
  ASSERT_EQ(cells.size(), 2u);
  EXPECT_FLOAT_EQ(cells[0], 0.5f);  // pixels 7 (black) and 8 (white)
  EXPECT_FLOAT_EQ(cells[1], 1.0f);
}

TEST(ReferencePreprocessing, ValidatesSideAndAspect) {
  EXPECT_NO_THROW(check_reference_size("a.png", 64, 64));
  EXPECT_NO_THROW(check_reference_size("a.png", 512, 64));  // exactly 8:1
  for (auto [w, h] : {std::pair{63, 100}, std::pair{100, 63}}) {
    try {
      check_reference_size("small.png", w, h);
      ADD_FAILURE() << w << "x" << h << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("small.png"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at least 64"), std::string::npos) << e.what();
    }
  }
  try {
    check_reference_size("thin.png", 65, 1000);
    ADD_FAILURE() << "65x1000 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("thin.png"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("15.4:1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(prepare_reference(solid_image(600, 70, 1, 2, 3), "x.png"), Error);
}

TEST(ReferencePreprocessing, ResizeTargetFollowsThePipeline) {
  EXPECT_EQ(reference_resize_target(1024, 1024).width, 1024);  // not above the area
  EXPECT_EQ(reference_resize_target(2000, 100).width, 2000);
  const ImageSize just_over = reference_resize_target(1025, 1024);  // s = 0.99951...
  EXPECT_EQ(just_over.width, 1024);
  EXPECT_EQ(just_over.height, 1023);
  const ImageSize wide = reference_resize_target(4096, 512);
  EXPECT_EQ(wide.width, 2896);  // s = sqrt(0.5): 2896.3 x 362.04
  EXPECT_EQ(wide.height, 362);
}

TEST(ReferencePreprocessing, LargeReferenceIsResizedThenCropped) {
  const Image prepared = prepare_reference(solid_image(3000, 2000, 10, 128, 250), "big.png");
  // s = sqrt(1024^2 / 6e6): 1253.9 x 835.9 -> 1253 x 835 -> cropped to 1248 x 832.
  EXPECT_EQ(prepared.width, 1248);
  EXPECT_EQ(prepared.height, 832);
  for (size_t i = 0; i < prepared.rgb.size(); i += 3)
    ASSERT_TRUE(prepared.rgb[i] == 10 && prepared.rgb[i + 1] == 128 && prepared.rgb[i + 2] == 250)
        << i / 3;
}

TEST(ReferencePreprocessing, MapsBytesToSignedUnitRange) {
  Image image(2, 1);
  image.rgb = {0, 255, 51, 128, 1, 254};
  const Tensor t = image_to_tensor(image);
  ASSERT_EQ(t.shape(), (Shape{3, 1, 2}));
  const float* v = t.data();  // channel planes: R(0,128) G(255,1) B(51,254)
  EXPECT_EQ(v[0], -1.0f);
  EXPECT_EQ(v[2], 1.0f);
  EXPECT_EQ(v[4], 2.0f * (51.0f / 255.0f) - 1.0f);
  EXPECT_FLOAT_EQ(v[1], 2.0f * 128 / 255 - 1);
}

// The decoder output of each end-to-end case, converted to bytes, must equal the PNG the
// official pipeline saved, in every channel of every pixel.
TEST(OutputConversion, MatchesThePipelinePngsExactly) {
  for (const char* name : {"t2i_h64_w64", "t2i_h96_w128", "edit_h64_w64_ref0"}) {
    SCOPED_TRACE(name);
    const fs::path dir = testing::tiny_vectors() / "e2e" / name;
    const Tensor decoded = read_npy(dir / "image_decoded.npy").to_tensor();
    const Image got = tensor_to_image(decoded);
    const Image want = load_image(dir / "image.png");
    ASSERT_EQ(got.width, want.width);
    ASSERT_EQ(got.height, want.height);
    size_t differing = 0;
    for (size_t i = 0; i < want.rgb.size(); ++i) differing += got.rgb[i] != want.rgb[i];
    EXPECT_EQ(differing, 0u) << "of " << want.rgb.size() << " channel values";
  }
}

// A decoder value y for which 255 * (y/2 + 0.5) is exactly level + 0.5 in float32, found by
// walking float32 values of u around the tie (for u >= 0.25 the map back to y is exact).
float tie_input(int level) {
  float u = (level + 0.5f) / 255.0f;
  for (int i = 0; i < 64; ++i) u = std::nextafter(u, 0.0f);
  for (int i = 0; i < 128; ++i, u = std::nextafter(u, 1.0f))
    if (u * 255.0f == level + 0.5f) return 2.0f * (u - 0.5f);
  return std::numeric_limits<float>::quiet_NaN();
}

TEST(OutputConversion, ClampsAndRoundsHalfToEven) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float values[] = {-5, 5, nan, 0, 0.5f, -0.5f, -1, 1};
  const int expected[] = {0, 255, 0, 128, 191, 64, 0, 255};  // 127.5 -> 128, 191.25, 63.75
  std::vector<float> inputs(std::begin(values), std::end(values));
  std::vector<int> want(std::begin(expected), std::end(expected));
  // Ties go to the even neighbour: 100.5 -> 100, 101.5 -> 102, and so on.
  for (int level = 100; level < 200; ++level) {
    const float y = tie_input(level);
    if (std::isnan(y)) continue;
    inputs.push_back(y);
    want.push_back(level % 2 == 0 ? level : level + 1);
  }
  ASSERT_GE(inputs.size(), 8u + 20u) << "too few exact ties found";
  const int n = int(inputs.size());
  Tensor t({1, 3, 1, n});  // the same values in all three channels
  for (int c = 0; c < 3; ++c) std::copy(inputs.begin(), inputs.end(), t.data() + c * n);
  const Image image = tensor_to_image(t);
  for (int x = 0; x < n; ++x)
    for (int c = 0; c < 3; ++c)
      ASSERT_EQ(image.pixel(x, 0)[c], want[size_t(x)]) << "y = " << inputs[size_t(x)];
  EXPECT_THROW(tensor_to_image(Tensor({4, 2, 2})), Error);
}

}  // namespace
}  // namespace klein
