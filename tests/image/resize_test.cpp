// Lanczos resize: PIL's published expectations for its LANCZOS filter, sizes and invariants.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "formats/image/preprocess.h"
#include "formats/image/resize.h"
#include "image/image_helpers.h"

namespace klein {
namespace {

using testing::solid_image;

// The accuracy image of Pillow's resampling tests: a side x side square whose top-left and
// bottom-right quadrants are `bright` and the other two 255 - bright, equal in all channels.
Image quadrants(int side, uint8_t bright) {
  Image image = solid_image(side, side, 255 - bright, 255 - bright, 255 - bright);
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x)
      if ((x < side / 2) == (y < side / 2))
        for (int c = 0; c < 3; ++c) image.pixel(x, y)[c] = bright;
  return image;
}

// Pillow states the expected result by its top-left quadrant (hex, row-major); the rest follows
// from the symmetry of the input: mirrored diagonally it is the same, mirrored on one axis
// it is inverted.
Image expand_quadrant(int side, const std::string& hex) {
  const int half = side / 2;
  Image image(side, side);
  for (int y = 0; y < half; ++y)
    for (int x = 0; x < half; ++x) {
      const auto v = uint8_t(std::stoi(hex.substr(size_t((y * half + x) * 2), 2), nullptr, 16));
      for (int c = 0; c < 3; ++c) {
        image.pixel(x, y)[c] = v;
        image.pixel(side - 1 - x, side - 1 - y)[c] = v;
        image.pixel(x, side - 1 - y)[c] = uint8_t(255 - v);
        image.pixel(side - 1 - x, y)[c] = uint8_t(255 - v);
      }
    }
  return image;
}

std::string hex_dump(const Image& image) {
  std::string out;
  char buf[4];
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      std::snprintf(buf, sizeof buf, "%02x ", image.pixel(x, y)[0]);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

// Expected values from Pillow's Tests/test_image_resample.py (test_reduce_lanczos and
// test_enlarge_lanczos), which its fixed-point implementation produces exactly.
TEST(LanczosResize, MatchesPilWhenShrinking) {
  const Image got = resize_lanczos(quadrants(16, 0xe1), 8, 8);
  const Image want = expand_quadrant(8, "e1e0e4d7" "e0dfe3d6" "e4e3e7da" "d7d6d9ce");
  EXPECT_EQ(got.rgb, want.rgb) << "got\n" << hex_dump(got) << "want\n" << hex_dump(want);
}

TEST(LanczosResize, MatchesPilWhenEnlarging) {
  const Image got = resize_lanczos(quadrants(6, 0xe1), 12, 12);
  const Image want = expand_quadrant(12,
                                     "e1e0dbedf5b8"
                                     "e0dfdaecf3b7"
                                     "dbdbd6e7eeb5"
                                     "edece6fbffbf"
                                     "f5f4eeffffc4"
                                     "b8b7b4bfc4a0");
  EXPECT_EQ(got.rgb, want.rgb) << "got\n" << hex_dump(got) << "want\n" << hex_dump(want);
}

void expect_solid(const Image& image, uint8_t r, uint8_t g, uint8_t b) {
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x) {
      const uint8_t* p = image.pixel(x, y);
      ASSERT_TRUE(p[0] == r && p[1] == g && p[2] == b)
          << "pixel " << x << "," << y << " is " << int(p[0]) << "," << int(p[1]) << ","
          << int(p[2]);
    }
}

// Pillow's consistency case: extreme shrinking on one axis and stretching on the other.
TEST(LanczosResize, KeepsAConstantImageWhenStretchingAndShrinking) {
  const Image got = resize_lanczos(solid_image(512, 9, 0, 64, 255), 9, 512);
  ASSERT_EQ(got.width, 9);
  ASSERT_EQ(got.height, 512);
  expect_solid(got, 0, 64, 255);
}

TEST(LanczosResize, LargeImageShrinksToTheReferenceAreaExactlyConstant) {
  const Image big = solid_image(4000, 3000, 37, 200, 255);
  const ImageSize target = reference_resize_target(big.width, big.height);
  // s = sqrt(1024^2 / 12e6) = 0.29560...: 1182.4 x 886.8, truncated.
  EXPECT_EQ(target.width, 1182);
  EXPECT_EQ(target.height, 886);
  const Image small = resize_lanczos(big, target.width, target.height);
  ASSERT_EQ(small.width, 1182);
  ASSERT_EQ(small.height, 886);
  expect_solid(small, 37, 200, 255);
  expect_solid(resize_lanczos(solid_image(3001, 1999, 255, 0, 1), 1234, 567), 255, 0, 1);
}

TEST(LanczosResize, ResizesOneAxisOnly) {
  const Image image = testing::pattern_image(40, 30);
  const Image wide = resize_lanczos(image, 80, 30);
  const Image tall = resize_lanczos(image, 40, 60);
  EXPECT_EQ(wide.width, 80);
  EXPECT_EQ(wide.height, 30);
  EXPECT_EQ(tall.width, 40);
  EXPECT_EQ(tall.height, 60);
  EXPECT_EQ(resize_lanczos(image, 40, 30).rgb, image.rgb);
}

TEST(LanczosResize, SmoothRampStaysARamp) {
  // A horizontal ramp shrunk by 3: each output pixel is the ramp at its centre, +-1 for
  // rounding (the filter is symmetric and reproduces linear functions away from the edges).
  Image ramp(600, 8);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 600; ++x)
      for (int c = 0; c < 3; ++c) ramp.pixel(x, y)[c] = uint8_t(x * 255 / 599);
  const Image small = resize_lanczos(ramp, 200, 8);
  for (int x = 10; x < 190; ++x) {
    const double centre = (x + 0.5) * 3 - 0.5;
    EXPECT_NEAR(small.pixel(x, 4)[0], centre * 255 / 599, 1.01) << x;
  }
}

TEST(LanczosResize, RejectsEmptySizes) {
  EXPECT_THROW(resize_lanczos(Image(), 4, 4), Error);
  EXPECT_THROW(resize_lanczos(solid_image(4, 4, 0, 0, 0), 0, 4), Error);
}

}  // namespace
}  // namespace klein
