#include "image/image_helpers.h"

#include <gtest/gtest.h>

#include <cstdio>  // before jpeglib.h, which uses FILE without including it

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <fstream>

namespace klein::testing {

namespace fs = std::filesystem;

Image pattern_image(int width, int height, uint32_t seed) {
  Image image(width, height);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        uint32_t v = uint32_t(x) * 2654435761u ^ uint32_t(y) * 40503u ^ uint32_t(c + 1) * seed;
        v ^= v >> 13;
        image.pixel(x, y)[c] = uint8_t(v * 1103515245u >> 24);
      }
  return image;
}

Image solid_image(int width, int height, uint8_t r, uint8_t g, uint8_t b) {
  Image image(width, height);
  for (size_t i = 0; i < image.rgb.size(); i += 3) {
    image.rgb[i] = r;
    image.rgb[i + 1] = g;
    image.rgb[i + 2] = b;
  }
  return image;
}

namespace {

// libpng's default error handler longjmps to png_jmpbuf; these functions keep only plain
// locals so that the jump skips nothing that needs destroying. Without rows, only the header
// is written, followed by an empty IDAT and the IEND chunk.
bool png_write_all(std::FILE* file, const PngSpec& spec, png_bytepp rows, png_colorp palette,
                   int num_palette) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_init_io(png, file);
  png_set_IHDR(png, info, png_uint_32(spec.width), png_uint_32(spec.height), spec.bit_depth,
               spec.color_type, spec.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (num_palette > 0) png_set_PLTE(png, info, palette, num_palette);
  if (!spec.palette_alpha.empty())
    png_set_tRNS(png, info, spec.palette_alpha.data(), int(spec.palette_alpha.size()), nullptr);
  if (!spec.exif.empty())
    png_set_eXIf_1(png, info, png_uint_32(spec.exif.size()),
                   const_cast<png_bytep>(spec.exif.data()));
  png_write_info(png, info);
  if (rows) {
    png_write_image(png, rows);
    png_write_end(png, info);
  } else {
    const png_byte idat[] = {'I', 'D', 'A', 'T', 0};
    const png_byte iend[] = {'I', 'E', 'N', 'D', 0};
    png_write_chunk(png, idat, nullptr, 0);
    png_write_chunk(png, iend, nullptr, 0);
  }
  png_destroy_write_struct(&png, &info);
  return true;
}

struct JpegTestErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};

void jpeg_test_error(j_common_ptr cinfo) {
  std::longjmp(reinterpret_cast<JpegTestErrors*>(cinfo->err)->jump, 1);
}

bool jpeg_write_all(std::FILE* file, int width, int height, int components, const uint8_t* samples,
                    bool progressive, int quality) {
  jpeg_compress_struct cinfo{};
  JpegTestErrors errors{};
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_test_error;
  if (setjmp(errors.jump)) {
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, file);
  cinfo.image_width = JDIMENSION(width);
  cinfo.image_height = JDIMENSION(height);
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(samples + size_t(cinfo.next_scanline) * size_t(width) *
                                                      size_t(components));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

}  // namespace

PngSpec png_spec(int width, int height, int color_type, int bit_depth, bool interlaced) {
  return PngSpec{.width = width,
                 .height = height,
                 .color_type = color_type,
                 .bit_depth = bit_depth,
                 .interlaced = interlaced};
}

void write_png_with_libpng(const fs::path& path, const PngSpec& spec) {
  ASSERT_EQ(spec.rows.size(), size_t(spec.height));
  std::vector<png_bytep> rows;
  for (const auto& r : spec.rows) rows.push_back(const_cast<png_bytep>(r.data()));
  std::vector<png_color> palette;
  for (size_t i = 0; i + 2 < spec.palette.size(); i += 3)
    palette.push_back({spec.palette[i], spec.palette[i + 1], spec.palette[i + 2]});
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  const bool ok = png_write_all(file, spec, rows.data(), palette.data(), int(palette.size()));
  std::fclose(file);
  ASSERT_TRUE(ok) << "libpng could not write " << path;
}

void write_png_header_only(const fs::path& path, uint32_t width, uint32_t height) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  const PngSpec spec = png_spec(int(width), int(height), PNG_COLOR_TYPE_RGB, 8, false);
  const bool ok = png_write_all(file, spec, nullptr, nullptr, 0);
  std::fclose(file);
  ASSERT_TRUE(ok) << "libpng could not write " << path;
}

void write_jpeg_with_libjpeg(const fs::path& path, int width, int height, int components,
                             const std::vector<uint8_t>& samples, bool progressive, int quality) {
  ASSERT_EQ(samples.size(), size_t(width) * size_t(height) * size_t(components));
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  const bool ok =
      jpeg_write_all(file, width, height, components, samples.data(), progressive, quality);
  std::fclose(file);
  ASSERT_TRUE(ok) << "libjpeg could not write " << path;
}

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace klein::testing
