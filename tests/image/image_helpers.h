#pragma once
// Test helpers: images with known content, files written straight through libpng/libjpeg
// (so the reader is tested on files our own writer never produces), raw file access.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/image/image.h"

namespace klein::testing {

// A deterministic image where every channel varies with x, y and the channel index.
Image pattern_image(int width, int height, uint32_t seed = 1);
// Every pixel the same colour.
Image solid_image(int width, int height, uint8_t r, uint8_t g, uint8_t b);

struct PngSpec {
  int width = 0;
  int height = 0;
  int color_type = 0;  // PNG_COLOR_TYPE_*
  int bit_depth = 8;
  bool interlaced = false;
  // Rows as PNG stores them (big-endian 16-bit samples, packed sub-byte samples).
  std::vector<std::vector<uint8_t>> rows;
  std::vector<uint8_t> palette;  // RGB triplets, for palette images
  std::vector<uint8_t> palette_alpha;  // tRNS entries, for palette images
  std::vector<uint8_t> exif;           // an eXIf chunk before the pixels, when not empty
};
PngSpec png_spec(int width, int height, int color_type, int bit_depth, bool interlaced = false);
// Writes `spec` with libpng; fails the current test on a libpng error.
void write_png_with_libpng(const std::filesystem::path& path, const PngSpec& spec);

// A PNG holding only a header that claims width x height pixels, and an empty IDAT chunk.
void write_png_header_only(const std::filesystem::path& path, uint32_t width, uint32_t height);

// Writes interleaved 8-bit samples (1 or 3 per pixel) as JPEG with libjpeg.
void write_jpeg_with_libjpeg(const std::filesystem::path& path, int width, int height,
                             int components, const std::vector<uint8_t>& samples,
                             bool progressive, int quality = 95);

std::vector<uint8_t> read_bytes(const std::filesystem::path& path);
void write_bytes(const std::filesystem::path& path, const std::vector<uint8_t>& bytes);

// Names of the entries in `dir` (to prove that failed saves leave nothing behind).
std::vector<std::string> list_dir(const std::filesystem::path& dir);

}  // namespace klein::testing
