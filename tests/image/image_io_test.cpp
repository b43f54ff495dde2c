// Reading and writing image files: formats, conversions to RGB, metadata, and the failures
// (corrupt, truncated, oversized, unwritable) that must end in a klein::Error.
#include <gtest/gtest.h>
#include <png.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>

#include "core/error.h"
#include "formats/image/image.h"
#include "image/image_helpers.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using namespace std::string_literals;
using testing::list_dir;
using testing::pattern_image;
using testing::png_spec;
using testing::PngSpec;
using testing::read_bytes;
using testing::temp_dir;
using testing::write_bytes;

// Expects `body` to throw klein::Error whose message contains every one of `parts`.
template <class Body>
void expect_error(Body&& body, std::initializer_list<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "no klein::Error thrown";
  } catch (const Error& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' lacks '" << part << "'";
  }
}

::testing::AssertionResult same_pixels(const Image& got, const Image& want) {
  if (got.width != want.width || got.height != want.height)
    return ::testing::AssertionFailure() << "size " << got.width << "x" << got.height
                                         << ", expected " << want.width << "x" << want.height;
  for (size_t i = 0; i < want.rgb.size(); ++i)
    if (got.rgb[i] != want.rgb[i])
      return ::testing::AssertionFailure()
             << "pixel " << i / 3 % size_t(want.width) << "," << i / 3 / size_t(want.width)
             << " channel " << i % 3 << ": " << int(got.rgb[i]) << ", expected "
             << int(want.rgb[i]);
  return ::testing::AssertionSuccess();
}

TEST(ImageFiles, ReadsTheReferencePng) {
  const Image image = load_image(testing::tiny_vectors() / "inputs" / "ref0.png");
  EXPECT_EQ(image.width, 88);
  EXPECT_EQ(image.height, 72);
  EXPECT_EQ(image.rgb.size(), size_t(88 * 72 * 3));
}

TEST(ImageFiles, PngRoundTripKeepsPixelsAndMetadata) {
  const fs::path dir = temp_dir("png_round_trip");
  const Image image = pattern_image(37, 23);
  const ImageMetadata metadata = {
      {"prompt", "a cat holding a sign"},
      {"seed", "42"},
      {"Comment", "größe ✓ 猫"},  // not Latin-1: needs iTXt
      {"empty", ""},
  };
  save_png(dir / "out.png", image, metadata);
  EXPECT_TRUE(same_pixels(load_image(dir / "out.png"), image));
  EXPECT_EQ(read_image_metadata(dir / "out.png"), metadata);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"out.png"});  // no temporary left
}

// An XMP packet: PNG's iTXt chunk "XML:com.adobe.xmp" even when it is ASCII, JPEG's APP1
// segment with the XMP header (not a comment); both read back under the same key.
TEST(ImageFiles, XmpPacketGoesWhereXmpReadersLook) {
  const fs::path dir = temp_dir("xmp");
  const Image image = pattern_image(24, 16);
  const std::string packet = "<x:xmpmeta xmlns:x=\"adobe:ns:meta/\"/>";
  const ImageMetadata metadata = {{"parameters", "p"}, {kXmpKey, packet}};
  save_png(dir / "x.png", image, metadata);
  EXPECT_EQ(read_image_metadata(dir / "x.png"), metadata);
  const auto png = read_bytes(dir / "x.png");
  const std::string png_text(png.begin(), png.end());
  EXPECT_NE(png_text.find(std::string("iTXtXML:com.adobe.xmp\0\0\0", 24)), std::string::npos);
  save_jpeg(dir / "x.jpg", image, 90, metadata);
  EXPECT_EQ(read_image_metadata(dir / "x.jpg"), (ImageMetadata{{kXmpKey, packet}, {"parameters", "p"}}));
  const auto jpg = read_bytes(dir / "x.jpg");
  const std::string jpg_text(jpg.begin(), jpg.end());
  const size_t at = jpg_text.find(std::string("http://ns.adobe.com/xap/1.0/\0", 29));
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(uint8_t(jpg_text[at - 4]), 0xff);
  EXPECT_EQ(uint8_t(jpg_text[at - 3]), 0xe1);  // APP1
  EXPECT_EQ(jpg_text.find(kXmpKey), std::string::npos);  // not as a key=value comment
}

TEST(ImageFiles, FormatIsTakenFromContentNotName) {
  const fs::path dir = temp_dir("sniff");
  const Image image = pattern_image(16, 16);
  save_png(dir / "really_a_png.jpg", image);
  EXPECT_TRUE(same_pixels(load_image(dir / "really_a_png.jpg"), image));
  save_image(dir / "chosen.JPEG", image);
  const auto bytes = read_bytes(dir / "chosen.JPEG");
  ASSERT_GE(bytes.size(), 3u);
  EXPECT_EQ(bytes[0], 0xff);
  EXPECT_EQ(bytes[1], 0xd8);
  expect_error([&] { save_image(dir / "out.bmp", image); }, {"out.bmp", ".bmp"});
}

TEST(ImageFiles, Reads16BitRgbByItsHighByte) {
  const fs::path dir = temp_dir("png16");
  const Image want = pattern_image(9, 7);
  PngSpec spec = png_spec(9, 7, PNG_COLOR_TYPE_RGB, 16);
  for (int y = 0; y < 7; ++y) {
    std::vector<uint8_t> row;
    for (int i = 0; i < 9 * 3; ++i) {
      row.push_back(want.row(y)[i]);                  // high byte (big-endian first)
      row.push_back(uint8_t(0xff - want.row(y)[i]));  // low byte: must not leak in
    }
    spec.rows.push_back(row);
  }
  testing::write_png_with_libpng(dir / "rgb16.png", spec);
  EXPECT_TRUE(same_pixels(load_image(dir / "rgb16.png"), want));
}

TEST(ImageFiles, DropsAlphaWithoutCompositing) {
  const fs::path dir = temp_dir("rgba");
  const Image want = pattern_image(11, 5);
  for (int depth : {8, 16}) {
    PngSpec spec = png_spec(11, 5, PNG_COLOR_TYPE_RGB_ALPHA, depth);
    for (int y = 0; y < 5; ++y) {
      std::vector<uint8_t> row;
      for (int x = 0; x < 11; ++x) {
        for (int c = 0; c < 4; ++c) {
          // Alpha runs through fully transparent and half transparent values.
          const uint8_t v = c < 3 ? want.pixel(x, y)[c] : uint8_t(x * 25);
          row.push_back(v);
          if (depth == 16) row.push_back(0x80);
        }
      }
      spec.rows.push_back(row);
    }
    const fs::path path = dir / ("rgba" + std::to_string(depth) + ".png");
    testing::write_png_with_libpng(path, spec);
    EXPECT_TRUE(same_pixels(load_image(path), want)) << path;
  }
}

TEST(ImageFiles, ReadsGrayAndGrayAlphaAsEqualChannels) {
  const fs::path dir = temp_dir("gray");
  const int w = 10, h = 4;
  auto gray_value = [](int x, int y) { return uint8_t(x * 23 + y * 61); };
  Image want(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) want.pixel(x, y)[c] = gray_value(x, y);

  PngSpec gray = png_spec(w, h, PNG_COLOR_TYPE_GRAY, 8);
  PngSpec gray_alpha = png_spec(w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 8);
  PngSpec gray16 = png_spec(w, h, PNG_COLOR_TYPE_GRAY, 16);
  for (int y = 0; y < h; ++y) {
    std::vector<uint8_t> g, ga, g16;
    for (int x = 0; x < w; ++x) {
      g.push_back(gray_value(x, y));
      ga.insert(ga.end(), {gray_value(x, y), uint8_t(255 - x)});
      g16.insert(g16.end(), {gray_value(x, y), 0xff});
    }
    gray.rows.push_back(g);
    gray_alpha.rows.push_back(ga);
    gray16.rows.push_back(g16);
  }
  testing::write_png_with_libpng(dir / "gray.png", gray);
  testing::write_png_with_libpng(dir / "gray_alpha.png", gray_alpha);
  testing::write_png_with_libpng(dir / "gray16.png", gray16);
  EXPECT_TRUE(same_pixels(load_image(dir / "gray.png"), want));
  EXPECT_TRUE(same_pixels(load_image(dir / "gray_alpha.png"), want));
  EXPECT_TRUE(same_pixels(load_image(dir / "gray16.png"), want));
}

TEST(ImageFiles, ScalesOneBitGrayToFullRange) {
  const fs::path dir = temp_dir("gray1");
  PngSpec spec = png_spec(8, 2, PNG_COLOR_TYPE_GRAY, 1);
  spec.rows = {{0b10110000}, {0b01001111}};
  testing::write_png_with_libpng(dir / "bits.png", spec);
  const Image image = load_image(dir / "bits.png");
  ASSERT_EQ(image.width, 8);
  const int expected[2][8] = {{1, 0, 1, 1, 0, 0, 0, 0}, {0, 1, 0, 0, 1, 1, 1, 1}};
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 8; ++x)
      for (int c = 0; c < 3; ++c)
        EXPECT_EQ(image.pixel(x, y)[c], expected[y][x] ? 255 : 0) << x << "," << y;
}

TEST(ImageFiles, ReadsPaletteColoursIgnoringTransparency) {
  const fs::path dir = temp_dir("palette");
  PngSpec spec = png_spec(4, 1, PNG_COLOR_TYPE_PALETTE, 8);
  spec.palette = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  spec.palette_alpha = {0, 128};  // entries 0 and 1 (partly) transparent
  spec.rows = {{3, 2, 1, 0}};
  testing::write_png_with_libpng(dir / "palette.png", spec);
  const Image image = load_image(dir / "palette.png");
  const std::vector<uint8_t> want = {10, 20, 30, 0, 0, 255, 0, 255, 0, 255, 0, 0};
  EXPECT_EQ(image.rgb, want);
}

TEST(ImageFiles, ReadsInterlacedPng) {
  const fs::path dir = temp_dir("interlaced");
  const Image want = pattern_image(13, 11);
  PngSpec spec = png_spec(13, 11, PNG_COLOR_TYPE_RGB, 8, true);
  for (int y = 0; y < 11; ++y) spec.rows.emplace_back(want.row(y), want.row(y) + want.row_bytes());
  testing::write_png_with_libpng(dir / "adam7.png", spec);
  EXPECT_TRUE(same_pixels(load_image(dir / "adam7.png"), want));
}

// A smooth image, as JPEG is meant for: the round trip must be close.
Image gradient_image(int width, int height) {
  Image image(width, height);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* p = image.pixel(x, y);
      p[0] = uint8_t(x * 255 / (width - 1));
      p[1] = uint8_t(y * 255 / (height - 1));
      p[2] = uint8_t(128 + (x - y) / 2);
    }
  return image;
}

void expect_close(const Image& got, const Image& want, double max_mean, int max_abs) {
  ASSERT_EQ(got.width, want.width);
  ASSERT_EQ(got.height, want.height);
  double sum = 0;
  int worst = 0;
  for (size_t i = 0; i < want.rgb.size(); ++i) {
    const int d = std::abs(int(got.rgb[i]) - int(want.rgb[i]));
    sum += d;
    worst = std::max(worst, d);
  }
  EXPECT_LE(sum / double(want.rgb.size()), max_mean);
  EXPECT_LE(worst, max_abs);
}

TEST(ImageFiles, JpegRoundTripIsClose) {
  const fs::path dir = temp_dir("jpeg_round_trip");
  const Image image = gradient_image(64, 48);
  const ImageMetadata metadata = {{"prompt", "a red cube = art"}, {"seed", "7"}};
  save_jpeg(dir / "out.jpg", image, 95, metadata);
  expect_close(load_image(dir / "out.jpg"), image, 1.0, 8);
  EXPECT_EQ(read_image_metadata(dir / "out.jpg"), metadata);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"out.jpg"});
}

// An EXIF block (the TIFF structure) with one orientation entry, in either byte order.
std::string exif_tiff(int orientation, bool little_endian) {
  std::string tiff = little_endian ? std::string("II\x2a\0\x08\0\0\0", 8)
                                   : std::string("MM\0\x2a\0\0\0\x08", 8);
  auto u16 = [&](int v) {
    return little_endian ? std::string{char(v & 0xff), char(v >> 8)}
                         : std::string{char(v >> 8), char(v & 0xff)};
  };
  tiff += u16(1);                                   // one entry
  tiff += u16(0x0112) + u16(3) + (little_endian ? std::string("\x01\0\0\0", 4)
                                                  : std::string("\0\0\0\x01", 4));
  tiff += u16(orientation) + u16(0);                // the SHORT and padding
  tiff += std::string(4, '\0');                    // no next IFD
  return tiff;
}

// The same block with its IFD offset pointing far past its end: malformed.
std::string broken_exif_tiff() {
  std::string tiff = exif_tiff(6, true);
  tiff[6] = '\x7f';
  return tiff;
}

// An EXIF APP1 segment with one orientation entry, in either byte order.
std::string exif_app1(int orientation, bool little_endian) {
  const std::string payload = std::string("Exif\0\0", 6) + exif_tiff(orientation, little_endian);
  const size_t length = payload.size() + 2;
  return std::string("\xff\xe1", 2) + char(length >> 8) + char(length & 0xff) + payload;
}

void write_string(const fs::path& path, const std::string& s) {
  write_bytes(path, std::vector<uint8_t>(s.begin(), s.end()));
}

// The stored picture turned upright as EXIF defines each orientation, written out here
// independently of the decoders: output pixel (x, y) comes from stored pixel (sx, sy).
Image upright(const Image& stored, int orientation) {
  const int w = stored.width, h = stored.height;
  const bool swap = orientation >= 5 && orientation <= 8;
  Image out(swap ? h : w, swap ? w : h);
  for (int y = 0; y < out.height; ++y)
    for (int x = 0; x < out.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2: sx = w - 1 - x; break;                  // mirrored left-right
        case 3: sx = w - 1 - x, sy = h - 1 - y; break;  // turned 180°
        case 4: sy = h - 1 - y; break;                  // mirrored top-bottom
        case 5: sx = y, sy = x; break;                  // transposed
        case 6: sx = y, sy = h - 1 - x; break;          // stored 90° counter-clockwise
        case 7: sx = w - 1 - y, sy = h - 1 - x; break;  // transversed
        case 8: sx = w - 1 - y, sy = x; break;          // stored 90° clockwise
      }
      std::memcpy(out.pixel(x, y), stored.pixel(sx, sy), 3);
    }
  return out;
}

// Cameras store the sensor's picture and an EXIF orientation; diffusers' load_image turns it
// upright (PIL's exif_transpose), so the decoder does: the same JPEG data with an orientation
// decodes to the plain decode rotated or mirrored as EXIF defines it.
TEST(ImageFiles, JpegExifOrientationIsApplied) {
  const fs::path dir = temp_dir("jpeg_exif");
  save_jpeg(dir / "plain.jpg", gradient_image(24, 16), 95, {});
  const std::vector<uint8_t> raw = read_bytes(dir / "plain.jpg");
  const std::string plain_bytes(raw.begin(), raw.end());
  const Image plain = load_image(dir / "plain.jpg");
  const int w = plain.width, h = plain.height;
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (bool little : {true, false}) {
      const fs::path file = dir / ("o" + std::to_string(orientation) + ".jpg");
      write_string(
          file, plain_bytes.substr(0, 2) + exif_app1(orientation, little) + plain_bytes.substr(2));
      const Image got = load_image(file);
      const bool swap = orientation >= 5;
      ASSERT_EQ(got.width, swap ? h : w) << orientation;
      ASSERT_EQ(got.height, swap ? w : h) << orientation;
      EXPECT_TRUE(same_pixels(got, upright(plain, orientation))) << "orientation " << orientation;
    }
  }
  // A malformed EXIF block (an IFD offset past the end) leaves the image as stored.
  const std::string payload = std::string("Exif\0\0", 6) + broken_exif_tiff();
  const std::string broken =
      std::string("\xff\xe1", 2) + char(0) + char(payload.size() + 2) + payload;
  write_string(dir / "broken.jpg", plain_bytes.substr(0, 2) + broken + plain_bytes.substr(2));
  EXPECT_TRUE(same_pixels(load_image(dir / "broken.jpg"), plain));
}

// A 128x96 picture, smooth (for JPEG) but for a pure red 16x8 block in its top-left corner:
// where that block lands shows which way the picture was turned.
Image cornered_image() {
  Image image = gradient_image(128, 96);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 16; ++x) {
      uint8_t* p = image.pixel(x, y);
      p[0] = 255, p[1] = 0, p[2] = 0;
    }
  return image;
}

bool is_red(const Image& image, int x, int y) {
  const uint8_t* p = image.pixel(x, y);
  return p[0] == 255 && p[1] == 0 && p[2] == 0;
}

// Orientation 6 ("turn 90° clockwise to display") of cornered_image(): 96x128, the stored
// top-left block now in the top-right corner, 8 wide and 16 high.
void expect_turned_clockwise(const Image& got, const std::string& what) {
  ASSERT_EQ(got.width, 96) << what;
  ASSERT_EQ(got.height, 128) << what;
  EXPECT_TRUE(is_red(got, 95, 0) && is_red(got, 88, 0) && is_red(got, 95, 15) &&
              is_red(got, 88, 15))
      << what << ": the red corner is not in the top-right";
  EXPECT_FALSE(is_red(got, 87, 0) || is_red(got, 95, 16) || is_red(got, 0, 0) ||
               is_red(got, 0, 127) || is_red(got, 95, 127))
      << what << ": red outside the corner";
}

// PNG's eXIf chunk holds the same EXIF block (written here with libpng, not our writer).
TEST(ImageFiles, PngExifOrientationIsApplied) {
  const fs::path dir = temp_dir("png_exif");
  const Image stored = cornered_image();
  const auto write = [&](const fs::path& path, const std::string& exif) {
    PngSpec spec = png_spec(stored.width, stored.height, PNG_COLOR_TYPE_RGB, 8);
    for (int y = 0; y < stored.height; ++y)
      spec.rows.emplace_back(stored.row(y), stored.row(y) + stored.row_bytes());
    spec.exif.assign(exif.begin(), exif.end());
    testing::write_png_with_libpng(path, spec);
  };
  for (int orientation = 1; orientation <= 8; ++orientation)
    for (bool little : {true, false}) {
      write(dir / "o.png", exif_tiff(orientation, little));
      EXPECT_TRUE(same_pixels(load_image(dir / "o.png"), upright(stored, orientation)))
          << "orientation " << orientation << (little ? " II" : " MM");
    }
  write(dir / "o6.png", exif_tiff(6, false));
  expect_turned_clockwise(load_image(dir / "o6.png"), "o6.png");
  // A malformed EXIF block leaves the image as stored, as in a JPEG.
  write(dir / "broken.png", broken_exif_tiff());
  EXPECT_TRUE(same_pixels(load_image(dir / "broken.png"), stored));
}

std::string le32(uint32_t v) { return {char(v), char(v >> 8), char(v >> 16), char(v >> 24)}; }

// A RIFF chunk: FourCC, little-endian size, payload, a pad byte to an even size.
std::string riff_chunk(const std::string& fourcc, const std::string& payload) {
  return fourcc + le32(uint32_t(payload.size())) + payload + (payload.size() % 2 ? "\0"s : ""s);
}

// An extended WebP laid out by hand as the container specification says (our writer never
// makes one): RIFF header, VP8X chunk (`flags`, canvas width x height), then `chunks`.
std::string extended_webp(int width, int height, uint8_t flags, const std::string& chunks) {
  const std::string vp8x = std::string{char(flags), 0, 0, 0} +
                           le32(uint32_t(width - 1)).substr(0, 3) +
                           le32(uint32_t(height - 1)).substr(0, 3);
  const std::string body = "WEBP" + riff_chunk("VP8X", vp8x) + chunks;
  return "RIFF" + le32(uint32_t(body.size())) + body;
}

constexpr uint8_t kWebPExifFlag = 0x08;  // in the VP8X header's flags

// A WebP's EXIF chunk: with the VP8X header's EXIF flag (0x08) set, its orientation is applied,
// exactly (lossless) and the same way as the JPEG path; with JPEG's "Exif\0\0" before the
// TIFF structure (some writers add it) or without (the specification, Pillow).
TEST(ImageFiles, WebPExifOrientationIsApplied) {
  const fs::path dir = temp_dir("webp_exif");
  const Image stored = cornered_image();
  // A simple lossless WebP: "RIFF", size, "WEBP", then its VP8L chunk, which is taken whole.
  save_image(dir / "simple.webp", stored);
  const std::vector<uint8_t> simple = read_bytes(dir / "simple.webp");
  ASSERT_EQ(std::string(simple.begin() + 12, simple.begin() + 16), "VP8L");
  const std::string image_chunk(simple.begin() + 12, simple.end());
  const auto webp = [&](const std::string& exif, uint8_t flags = kWebPExifFlag) {
    return extended_webp(stored.width, stored.height, flags,
                         image_chunk + riff_chunk("EXIF", exif));
  };
  for (int orientation = 1; orientation <= 8; ++orientation)
    for (bool little : {true, false})
      for (const std::string& prefix : {""s, "Exif\0\0"s}) {
        write_string(dir / "o.webp", webp(prefix + exif_tiff(orientation, little)));
        EXPECT_TRUE(same_pixels(load_image(dir / "o.webp"), upright(stored, orientation)))
            << "orientation " << orientation << (little ? " II" : " MM") << " prefix "
            << prefix.size();
      }
  write_string(dir / "o6.webp", webp(exif_tiff(6, true)));
  const Image turned = load_image(dir / "o6.webp");
  expect_turned_clockwise(turned, "o6.webp");
  // The JPEG path turns the same picture with the same EXIF block the same way.
  save_jpeg(dir / "plain.jpg", stored, 95, {});
  const std::vector<uint8_t> jpeg = read_bytes(dir / "plain.jpg");
  write_string(dir / "o6.jpg", std::string(jpeg.begin(), jpeg.begin() + 2) + exif_app1(6, true) +
                                   std::string(jpeg.begin() + 2, jpeg.end()));
  expect_close(load_image(dir / "o6.jpg"), turned, 1.5, 80);

  // Without the EXIF flag the chunk is not read (libwebp's demuxer, and so Pillow, skip it).
  write_string(dir / "unflagged.webp", webp(exif_tiff(6, true), 0));
  EXPECT_TRUE(same_pixels(load_image(dir / "unflagged.webp"), stored));
  // A malformed EXIF block leaves the image as stored, as in a JPEG.
  write_string(dir / "broken.webp", webp(broken_exif_tiff()));
  EXPECT_TRUE(same_pixels(load_image(dir / "broken.webp"), stored));
  // An EXIF chunk declaring more bytes than the file holds (the RIFF size agreeing with the
  // file): the pixels are whole, the container is not; the image is left as stored, as a
  // broken EXIF block leaves a JPEG (Pillow, whose demuxer reads the whole container, refuses
  // the file; libwebp's decoder reads the pixels).
  std::string overrun = webp(exif_tiff(6, true));
  const size_t exif_at = overrun.rfind("EXIF");
  overrun.replace(exif_at + 4, 4, le32(1000));
  write_string(dir / "overrun.webp", overrun);
  EXPECT_TRUE(same_pixels(load_image(dir / "overrun.webp"), stored));
  // The file cut inside its EXIF chunk (the RIFF size promising more): libwebp refuses it as
  // truncated, as libjpeg refuses a JPEG cut short.
  const std::string whole = webp(exif_tiff(6, true));
  write_string(dir / "cut.webp", whole.substr(0, whole.size() - 10));
  expect_error([&] { load_image(dir / "cut.webp"); }, {"cut.webp", "WebP", "truncated"});
}

// A WebP written by Pillow with EXIF orientation 6 (tools/images/exif_fixture.py) reads as the
// upright RGB image Pillow's exif_transpose makes of it, as diffusers' load_image loads it.
TEST(ImageFiles, WebPExifOrientationAsPillowTurnsIt) {
  const fs::path data = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "images";
  const Image got = load_image(data / "exif6.webp");
  ASSERT_EQ(got.width, 24);
  ASSERT_EQ(got.height, 40);
  EXPECT_TRUE(is_red(got, 23, 0) && is_red(got, 20, 7) && !is_red(got, 19, 0) &&
              !is_red(got, 23, 8));
  EXPECT_TRUE(same_pixels(got, load_image(data / "exif6-ref.png")));
}

TEST(ImageFiles, ReadsProgressiveAndGrayJpeg) {
  const fs::path dir = temp_dir("jpeg_kinds");
  const Image image = gradient_image(40, 30);
  testing::write_jpeg_with_libjpeg(dir / "progressive.jpg", 40, 30, 3, image.rgb, true);
  expect_close(load_image(dir / "progressive.jpg"), image, 1.0, 8);

  std::vector<uint8_t> gray;
  Image gray_rgb(40, 30);
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 40; ++x) {
      gray.push_back(uint8_t(x * 6));
      for (int c = 0; c < 3; ++c) gray_rgb.pixel(x, y)[c] = uint8_t(x * 6);
    }
  testing::write_jpeg_with_libjpeg(dir / "gray.jpg", 40, 30, 1, gray, false);
  const Image loaded = load_image(dir / "gray.jpg");
  expect_close(loaded, gray_rgb, 1.0, 8);
  for (size_t i = 0; i < loaded.rgb.size(); i += 3) {
    ASSERT_EQ(loaded.rgb[i], loaded.rgb[i + 1]);
    ASSERT_EQ(loaded.rgb[i], loaded.rgb[i + 2]);
  }
}

TEST(ImageFiles, TruncatedPngIsAnError) {
  const fs::path dir = temp_dir("truncated_png");
  save_png(dir / "whole.png", pattern_image(64, 64));
  auto bytes = read_bytes(dir / "whole.png");
  bytes.resize(bytes.size() / 2);
  write_bytes(dir / "half.png", bytes);
  expect_error([&] { load_image(dir / "half.png"); }, {"half.png", "truncated"});
  bytes.resize(20);  // inside the header
  write_bytes(dir / "head.png", bytes);
  expect_error([&] { load_image(dir / "head.png"); }, {"head.png", "truncated"});
}

TEST(ImageFiles, TruncatedJpegIsAnError) {
  const fs::path dir = temp_dir("truncated_jpeg");
  const Image image = pattern_image(64, 64);
  save_jpeg(dir / "whole.jpg", image);
  testing::write_jpeg_with_libjpeg(dir / "whole_progressive.jpg", 64, 64, 3, image.rgb, true);
  for (const char* name : {"whole.jpg", "whole_progressive.jpg"}) {
    auto bytes = read_bytes(dir / name);
    bytes.resize(bytes.size() * 2 / 3);
    write_bytes(dir / "cut.jpg", bytes);
    expect_error([&] { load_image(dir / "cut.jpg"); }, {"cut.jpg", "truncated"});
  }
}

TEST(ImageFiles, CorruptDataIsAnError) {
  const fs::path dir = temp_dir("corrupt");
  std::vector<uint8_t> garbage(1000);
  for (size_t i = 0; i < garbage.size(); ++i) garbage[i] = uint8_t(i * 7919 >> 3);
  write_bytes(dir / "garbage.png", garbage);
  expect_error([&] { load_image(dir / "garbage.png"); }, {"garbage.png", "PNG, JPEG or WebP"});

  write_bytes(dir / "empty.png", {});
  expect_error([&] { load_image(dir / "empty.png"); }, {"empty.png", "empty"});

  // A real PNG with its image data overwritten: fails on the chunk CRC or in zlib.
  save_png(dir / "good.png", pattern_image(32, 32));
  auto png = read_bytes(dir / "good.png");
  for (size_t i = 60; i < png.size() - 20; ++i) png[i] = garbage[i % garbage.size()];
  write_bytes(dir / "scrambled.png", png);
  expect_error([&] { load_image(dir / "scrambled.png"); }, {"scrambled.png"});

  // Garbage behind a JPEG signature.
  std::vector<uint8_t> jpeg = garbage;
  jpeg[0] = 0xff, jpeg[1] = 0xd8, jpeg[2] = 0xff;
  write_bytes(dir / "bad.jpg", jpeg);
  expect_error([&] { load_image(dir / "bad.jpg"); }, {"bad.jpg"});

  expect_error([&] { load_image(dir / "missing.png"); }, {"missing.png"});
}

TEST(ImageFiles, HugePngHeaderIsRefusedBeforeDecoding) {
  const fs::path dir = temp_dir("png_bomb");
  testing::write_png_header_only(dir / "bomb.png", 100000, 100000);
  expect_error([&] { load_image(dir / "bomb.png"); }, {"bomb.png", "100000x100000", "limit"});
}

// A text chunk declaring 100 MB (the file ends right after its header) is refused by its
// declared length before libpng allocates it (found by fuzz/fuzz_image: 2 GB allocations).
TEST(ImageFiles, HugePngChunkIsRefusedBeforeAllocating) {
  const fs::path dir = temp_dir("png_chunk_bomb");
  save_png(dir / "small.png", gradient_image(8, 8), {});
  const std::vector<uint8_t> png = read_bytes(dir / "small.png");
  // Signature (8) + IHDR (4 + 4 + 13 + 4), then a tEXt chunk header of 100,000,000 bytes.
  std::vector<uint8_t> bomb(png.begin(), png.begin() + 33);
  for (int b : {0x05, 0xf5, 0xe1, 0x00, int('t'), int('E'), int('X'), int('t')}) bomb.push_back(uint8_t(b));
  write_bytes(dir / "bomb.png", bomb);
  expect_error([&] { load_image(dir / "bomb.png"); },
               {"bomb.png", "chunk tEXt declares 100000000 bytes"});
}

TEST(ImageFiles, HugeJpegHeaderIsRefusedBeforeDecoding) {
  const fs::path dir = temp_dir("jpeg_bomb");
  save_jpeg(dir / "small.jpg", pattern_image(16, 16));
  auto bytes = read_bytes(dir / "small.jpg");
  // Rewrite the frame header (SOF0: FF C0, length, precision, height, width) to 60000x60000.
  size_t sof = 0;
  for (size_t i = 2; i + 9 < bytes.size(); ++i)
    if (bytes[i] == 0xff && bytes[i + 1] == 0xc0) {
      sof = i;
      break;
    }
  ASSERT_NE(sof, 0u) << "no SOF0 marker in our own baseline JPEG";
  for (size_t at : {sof + 5, sof + 7}) {
    bytes[at] = 60000 >> 8;
    bytes[at + 1] = 60000 & 0xff;
  }
  write_bytes(dir / "bomb.jpg", bytes);
  expect_error([&] { load_image(dir / "bomb.jpg"); }, {"bomb.jpg", "60000x60000", "limit"});
}

TEST(ImageFiles, LimitsAreConfigurable) {
  const fs::path dir = temp_dir("limits");
  save_png(dir / "wide.png", pattern_image(300, 20));
  save_jpeg(dir / "wide.jpg", pattern_image(300, 20));
  for (const char* name : {"wide.png", "wide.jpg"}) {
    EXPECT_NO_THROW(load_image(dir / name));
    expect_error([&] { load_image(dir / name, {.max_side = 299}); }, {name, "300x20"});
    expect_error([&] { load_image(dir / name, {.max_pixels = 5999}); }, {name, "300x20"});
    EXPECT_EQ(load_image(dir / name, {.max_side = 300, .max_pixels = 6000}).width, 300);
  }
}

TEST(ImageFiles, RejectsBadMetadataBeforeWriting) {
  const fs::path dir = temp_dir("bad_metadata");
  const Image image = pattern_image(8, 8);
  const std::vector<std::string> bad_keys = {"",    " lead", "trail ", "two  spaces", "a=b",
                                             "tab\tkey", std::string(80, 'k'), "caf\xc3\xa9"};
  for (const std::string& key : bad_keys) {
    expect_error([&] { save_png(dir / "out.png", image, {{key, "v"}}); }, {"out.png", "key"});
    expect_error([&] { save_jpeg(dir / "out.jpg", image, 90, {{key, "v"}}); }, {"out.jpg"});
  }
  expect_error([&] { save_png(dir / "out.png", image, {{"k", std::string("a\0b", 3)}}); },
               {"NUL"});
  expect_error([&] { save_png(dir / "out.png", image, {{"k", "\xff\xfe"}}); }, {"UTF-8"});
  expect_error([&] { save_jpeg(dir / "out.jpg", image, 0); }, {"quality"});
  EXPECT_TRUE(list_dir(dir).empty());
}

TEST(ImageFiles, FailedSaveLeavesNoFile) {
  const fs::path dir = temp_dir("failed_save");
  const Image image = pattern_image(8, 8);
  expect_error([&] { save_png(dir / "no" / "such" / "dir.png", image); }, {"dir.png"});
  Image broken = image;
  broken.rgb.resize(10);
  expect_error([&] { save_png(dir / "broken.png", broken); }, {"broken.png"});
  expect_error([&] { save_jpeg(dir / "broken.jpg", broken); }, {"broken.jpg"});
  EXPECT_TRUE(list_dir(dir).empty());
}

// Runs save() in a child process whose files may not grow beyond `max_bytes`, so that the
// encoder fails halfway through writing. Returns the child's verdict: 0 = klein::Error
// thrown, 1 = the save succeeded, 2 = something else went wrong.
template <class Save>
int save_with_file_size_limit(rlim_t max_bytes, Save&& save) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // make write() fail with EFBIG instead of killing us
    rlimit limit{};
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = max_bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int verdict = 2;
    try {
      save();
      verdict = 1;
    } catch (const Error&) {
      verdict = 0;
    } catch (...) {
    }
    ::_exit(verdict);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

TEST(ImageFiles, WriteErrorHalfwayLeavesNoFile) {
  const fs::path dir = temp_dir("disk_full");
  const Image noise = pattern_image(512, 512);  // about 800 kB whichever the format
  EXPECT_EQ(save_with_file_size_limit(64 << 10, [&] { save_png(dir / "out.png", noise); }), 0);
  EXPECT_EQ(save_with_file_size_limit(64 << 10, [&] { save_jpeg(dir / "out.jpg", noise, 100); }),
            0);
  EXPECT_TRUE(list_dir(dir).empty());
  // The same saves succeed without the limit: the failure above came from the limit.
  EXPECT_EQ(save_with_file_size_limit(RLIM_INFINITY, [&] { save_png(dir / "out.png", noise); }),
            1);
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"out.png"});
}

TEST(ImageFiles, ReadsForeignJpegComments) {
  const fs::path dir = temp_dir("jpeg_comment");
  save_jpeg(dir / "a.jpg", pattern_image(8, 8), 90, {{"seed", "1"}});
  auto bytes = read_bytes(dir / "a.jpg");
  // Insert a free-form Latin-1 comment right after SOI.
  const std::string text = "made by hand, caf\xe9";
  std::vector<uint8_t> com = {0xff, 0xfe, 0, uint8_t(text.size() + 2)};
  com.insert(com.end(), text.begin(), text.end());
  bytes.insert(bytes.begin() + 2, com.begin(), com.end());
  write_bytes(dir / "b.jpg", bytes);
  const ImageMetadata want = {{"comment", "made by hand, caf\xc3\xa9"}, {"seed", "1"}};
  EXPECT_EQ(read_image_metadata(dir / "b.jpg"), want);
}

// A CMYK JPEG (written by Pillow: tools/images/cmyk_fixture.py) reads as the RGB image Pillow's
// convert("RGB") makes of it, as the official pipelines load their images; exactly, since both
// decode with the system's libjpeg.
TEST(ImageFiles, CmykJpegReadsAsPillowConvertsIt) {
  const fs::path data = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "images";
  const Image got = load_image(data / "cmyk.jpg");
  const Image want = load_image(data / "cmyk-ref.png");
  ASSERT_EQ(got.width, 40);
  ASSERT_EQ(got.height, 24);
  int differing = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i) differing += got.rgb[i] != want.rgb[i];
  EXPECT_EQ(differing, 0);
  // Not trivially equal: inks and the black checker make many colours.
  std::set<uint8_t> reds(want.rgb.begin(), want.rgb.end());
  EXPECT_GT(reds.size(), 50u);
}

// WebP files written by Pillow (tools/images/webp_fixture.py) read as the RGB images Pillow's
// convert("RGB") makes of them: lossy (libwebp's YUV conversion, the same library as Pillow's)
// and lossless with alpha (alpha dropped, the colour under transparent pixels kept).
TEST(ImageFiles, WebPReadsAsPillowConvertsIt) {
  const fs::path data = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "images";
  for (const char* name : {"lossy", "alpha"}) {
    const Image got = load_image(data / (std::string(name) + ".webp"));
    const Image want = load_image(data / (std::string(name) + "-ref.png"));
    EXPECT_EQ(got.width, 40) << name;
    EXPECT_TRUE(same_pixels(got, want)) << name;
    std::set<uint8_t> values(want.rgb.begin(), want.rgb.end());
    EXPECT_GT(values.size(), 30u) << name;
  }
  expect_error([&] { load_image(data / "animated.webp"); }, {"animated.webp", "animated WebP"});
  // The declared size is refused before decoding.
  ImageLimits small;
  small.max_side = 16;
  expect_error([&] { load_image(data / "lossy.webp", small); }, {"lossy.webp", "40"});
  // Truncated: a clear error, never a partial image.
  const fs::path dir = temp_dir("webp_bad");
  const std::vector<uint8_t> bytes = read_bytes(data / "lossy.webp");
  write_bytes(dir / "cut.webp", std::vector<uint8_t>(bytes.begin(), bytes.begin() + 60));
  expect_error([&] { load_image(dir / "cut.webp"); }, {"cut.webp", "WebP"});
}

// .webp output is lossless: the exact pixels come back, and nothing is left but the file.
TEST(ImageFiles, WebPRoundTripKeepsPixels) {
  const fs::path dir = temp_dir("webp_round_trip");
  const Image image = pattern_image(37, 23);
  save_image(dir / "out.WebP", image, {{"prompt", "x"}});
  const std::vector<uint8_t> head = read_bytes(dir / "out.WebP");
  ASSERT_GT(head.size(), 12u);
  EXPECT_EQ(std::string(head.begin() + 8, head.begin() + 12), "WEBP");
  EXPECT_TRUE(same_pixels(load_image(dir / "out.WebP"), image));
  EXPECT_EQ(list_dir(dir), std::vector<std::string>{"out.WebP"});
  expect_error([&] { save_image(dir / "huge.webp", Image(16384, 1)); }, {"huge.webp", "16383"});
  EXPECT_FALSE(fs::exists(dir / "huge.webp"));
}

}  // namespace
}  // namespace klein
