// PNG through libpng. libpng reports errors by calling our handler, which must not return:
// it records the message and longjmps back to the setjmp of the step that was running. The
// step functions below (read_png_info, read_png_pixels, write_png_file) are therefore written
// like C: they own nothing with a destructor, so the jump skips no cleanup. Memory and the
// libpng structs are owned by the C++ callers, which throw once a step reports failure.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "core/error.h"
#include "formats/image/codecs.h"
#include "formats/image/exif.h"

namespace klein::codecs {

namespace {

constexpr size_t kMessageSize = 256;

struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_infop end_info = nullptr;
  const png_byte* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[kMessageSize] = {};

  PngReader() = default;
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;
  ~PngReader() { png_destroy_read_struct(&png, &info, &end_info); }
};

struct PngWriter {
  png_structp png = nullptr;
  png_infop info = nullptr;
  char message[kMessageSize] = {};

  PngWriter() = default;
  PngWriter(const PngWriter&) = delete;
  PngWriter& operator=(const PngWriter&) = delete;
  ~PngWriter() { png_destroy_write_struct(&png, &info); }
};

// libpng passes back the error pointer given at creation: the message buffer of the reader
// or writer.
void on_png_error(png_structp png, png_const_charp text) {
  auto* message = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(message, kMessageSize, "%s", text);
  png_longjmp(png, 1);
}

// Warnings concern ancillary chunks we do not use (colour profiles, bad tIME...): ignore.
void on_png_warning(png_structp, png_const_charp) {}

void read_from_memory(png_structp png, png_bytep out, size_t n) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (reader->size - reader->pos < n) png_error(png, "file is truncated");
  std::memcpy(out, reader->data + reader->pos, n);
  reader->pos += n;
}

// Chunks up to the first IDAT: size, colour type, early text chunks.
bool read_png_info(PngReader& r) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  png_read_info(r.png, r.info);
  return true;
}

// Asks libpng for 8-bit RGB whatever is stored, decodes every row (all interlace passes) into
// `rows`, then reads the chunks after the image data (late text, IEND, their CRCs).
bool read_png_pixels(PngReader& r, png_bytepp rows) {
  if (setjmp(png_jmpbuf(r.png))) return false;
  const int color = png_get_color_type(r.png, r.info);
  const int depth = png_get_bit_depth(r.png, r.info);
  // The high byte of 16-bit samples, as PIL reads 16-bit RGB(A).
  if (depth == 16) png_set_strip_16(r.png);
  if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r.png);
  if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(r.png);
  if (!(color & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(r.png);
  // Alpha, stored or expanded from a palette's tRNS, is dropped rather than composited.
  png_set_strip_alpha(r.png);
  png_set_interlace_handling(r.png);
  png_read_update_info(r.png, r.info);
  if (png_get_rowbytes(r.png, r.info) != size_t(png_get_image_width(r.png, r.info)) * 3)
    png_error(r.png, "unexpected pixel layout after conversion to 8-bit RGB");
  png_read_image(r.png, rows);
  png_read_end(r.png, r.end_info);
  return true;
}

// Writes signature, header, text chunks, rows and IEND to the stream.
bool write_png_file(PngWriter& w, std::FILE* out, int width, int height, png_bytepp rows,
                    png_textp text, int num_text) {
  if (setjmp(png_jmpbuf(w.png))) return false;
  png_init_io(w.png, out);
  png_set_IHDR(w.png, w.info, png_uint_32(width), png_uint_32(height), 8, PNG_COLOR_TYPE_RGB,
               PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (num_text > 0) png_set_text(w.png, w.info, text, num_text);
  png_write_info(w.png, w.info);
  png_write_image(w.png, rows);
  png_write_end(w.png, w.info);
  return true;
}

uint32_t read_be32(const std::byte* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// The size from the IHDR chunk, checked against the limits before libpng allocates anything.
void check_png_header(std::span<const std::byte> data, const std::string& name,
                      const ImageLimits& limits) {
  check(data.size() >= 24, name, ": cannot read PNG: file is truncated");
  check(std::memcmp(data.data() + 12, "IHDR", 4) == 0, name,
        ": cannot read PNG: the first chunk is not IHDR");
  check_image_size(name, read_be32(data.data() + 16), read_be32(data.data() + 20), limits);
  // Every chunk's declared length must fit in what the file holds: libpng allocates a chunk's
  // buffer from its declared length before reading it, so a text chunk claiming 2 GB in a
  // 1 KB file would be allocated first (found by fuzz/fuzz_image).
  for (size_t at = 8; data.size() - at >= 8;) {
    const uint32_t length = read_be32(data.data() + at);
    const std::string type(reinterpret_cast<const char*>(data.data() + at + 4), 4);
    check(uint64_t(length) + 12 <= data.size() - at, name, ": cannot read PNG: file is truncated "
          "(chunk ", type, " declares ", length, " bytes, ", data.size() - at - 8, " remain)");
    if (type == "IEND") break;
    at += 12 + size_t(length);
  }
}

// tEXt and zTXt hold Latin-1, iTXt holds UTF-8; keys are always Latin-1.
void append_text_chunks(png_structp png, png_infop info, ImageMetadata& out) {
  png_textp text = nullptr;
  int count = 0;
  png_get_text(png, info, &text, &count);
  for (int i = 0; i < count; ++i) {
    const bool utf8 = text[i].compression == PNG_ITXT_COMPRESSION_NONE ||
                      text[i].compression == PNG_ITXT_COMPRESSION_zTXt;
    out.emplace_back(latin1_to_utf8(text[i].key),
                     utf8 ? std::string(text[i].text) : latin1_to_utf8(text[i].text));
  }
}

// The EXIF orientation of an eXIf chunk (before or after the pixels); 1 without one. Some
// writers put JPEG's "Exif\0\0" before the TIFF structure.
int orientation_of(const PngReader& r) {
  for (png_infop info : {r.info, r.end_info}) {
    png_uint_32 size = 0;
    png_bytep exif = nullptr;
    if (!png_get_eXIf_1(r.png, info, &size, &exif) || !exif || size == 0) continue;
    std::span<const std::byte> tiff = std::as_bytes(std::span(exif, size));
    if (size >= 6 && std::memcmp(exif, "Exif\0\0", 6) == 0) tiff = tiff.subspan(6);
    return exif_orientation(tiff);
  }
  return 1;
}

bool is_ascii(const std::string& s) {
  for (char c : s)
    if (uint8_t(c) >= 0x80) return false;
  return true;
}

}  // namespace

Image decode_png(std::span<const std::byte> data, const std::string& name,
                 const ImageLimits& limits, ImageMetadata* metadata) {
  check_png_header(data, name, limits);
  PngReader r;
  r.data = reinterpret_cast<const png_byte*>(data.data());
  r.size = data.size();
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, r.message, on_png_error, on_png_warning);
  check(r.png != nullptr, name, ": cannot start the PNG decoder");
  r.info = png_create_info_struct(r.png);
  r.end_info = png_create_info_struct(r.png);
  check(r.info && r.end_info, name, ": cannot start the PNG decoder");
  png_set_read_fn(r.png, &r, read_from_memory);
  // A second line of defence behind check_png_header, inside libpng itself.
  png_set_user_limits(r.png, png_uint_32(limits.max_side), png_uint_32(limits.max_side));


  if (!read_png_info(r)) fail(name, ": cannot read PNG: ", r.message);
  const int width = int(png_get_image_width(r.png, r.info));
  const int height = int(png_get_image_height(r.png, r.info));
  check_image_size(name, width, height, limits);

  Image image(width, height);
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) rows[size_t(y)] = image.row(y);
  if (!read_png_pixels(r, rows.data())) fail(name, ": cannot read PNG: ", r.message);

  if (metadata) {
    append_text_chunks(r.png, r.info, *metadata);
    append_text_chunks(r.png, r.end_info, *metadata);
  }
  return apply_orientation(std::move(image), orientation_of(r));
}

void encode_png(std::FILE* out, const std::string& name, const Image& image,
                const ImageMetadata& metadata) {
  // libpng wants mutable strings; these copies live until the file is written.
  ImageMetadata strings = metadata;
  std::vector<png_text> text(strings.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    auto& [key, value] = strings[i];
    std::memset(&text[i], 0, sizeof(png_text));
    // Plain ASCII is valid Latin-1 and readable by every tool as tEXt; the rest needs iTXt.
    // XMP goes in iTXt whatever it holds (its readers look there only).
    text[i].compression = is_ascii(value) && key != kXmpKey ? PNG_TEXT_COMPRESSION_NONE
                                                            : PNG_ITXT_COMPRESSION_NONE;
    text[i].key = key.data();
    text[i].text = value.data();
    if (text[i].compression == PNG_TEXT_COMPRESSION_NONE)
      text[i].text_length = value.size();
    else
      text[i].itxt_length = value.size();
  }

  std::vector<png_bytep> rows(size_t(image.height));
  for (int y = 0; y < image.height; ++y)
    rows[size_t(y)] = const_cast<png_bytep>(image.row(y));  // libpng only reads them

  PngWriter w;
  w.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, w.message, on_png_error, on_png_warning);
  check(w.png != nullptr, "cannot write ", name, ": cannot start the PNG encoder");
  w.info = png_create_info_struct(w.png);
  check(w.info != nullptr, "cannot write ", name, ": cannot start the PNG encoder");
  if (!write_png_file(w, out, image.width, image.height, rows.data(), text.data(),
                      int(text.size())))
    fail("cannot write ", name, ": ", w.message);
}

}  // namespace klein::codecs
