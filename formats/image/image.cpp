#include "formats/image/image.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/files.h"
#include "formats/image/codecs.h"

namespace klein {

namespace fs = std::filesystem;

Image::Image(int width, int height) : width(width), height(height) {
  check(width >= 0 && height >= 0, "image size ", width, "x", height, " is negative");
  rgb.assign(size_t(width) * size_t(height) * 3, 0);
}

namespace {

using namespace std::string_view_literals;

bool starts_with(std::span<const std::byte> data, std::string_view magic, size_t at = 0) {
  return data.size() >= at + magic.size() &&
         std::memcmp(data.data() + at, magic.data(), magic.size()) == 0;
}

// A hint for files that are images, just not of a format we read.
std::string describe_unsupported(std::span<const std::byte> data) {
  if (starts_with(data, "GIF8")) return "a GIF file";
  if (starts_with(data, "BM")) return "a BMP file";
  if (starts_with(data, "II*\0"sv) || starts_with(data, "MM\0*"sv)) return "a TIFF file";
  return "not an image file we recognise";
}

// Whether the stored image is consistent enough to hand to an encoder.
void check_writable(const std::string& where, const Image& image) {
  check(image.width > 0 && image.height > 0, "cannot write ", where, ": image is ", image.width,
        "x", image.height);
  check(image.rgb.size() == size_t(image.width) * size_t(image.height) * 3, "cannot write ",
        where, ": image of ", image.width, "x", image.height, " has ", image.rgb.size(),
        " bytes of pixels, expected ", size_t(image.width) * size_t(image.height) * 3);
}

// Keys as check_metadata_key says; values UTF-8 without NUL (text chunks and comments are
// NUL-free), checked before any output file exists.
void check_metadata(const std::string& where, const ImageMetadata& metadata) {
  for (const auto& [key, value] : metadata) {
    check_metadata_key(where, key);
    check(value.find('\0') == std::string::npos, where, ": metadata value of '", key,
          "' contains a NUL character");
    check(codecs::is_valid_utf8(value), where, ": metadata value of '", key,
          "' is not valid UTF-8");
  }
}

std::string lowercase_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return ext;
}

Image decode_any(std::span<const std::byte> data, const std::string& name,
                 const ImageLimits& limits, ImageMetadata* metadata) {
  check(!data.empty(), name, ": file is empty");
  switch (sniff_image_format(data)) {
    case ImageFormat::Png: return codecs::decode_png(data, name, limits, metadata);
    case ImageFormat::Jpeg: return codecs::decode_jpeg(data, name, limits, metadata);
    case ImageFormat::WebP: return codecs::decode_webp(data, name, limits, metadata);
    case ImageFormat::Unknown: break;
  }
  fail(name, ": cannot read image: ", describe_unsupported(data), " (expected PNG, JPEG or WebP)");
}

}  // namespace

ImageFormat sniff_image_format(std::span<const std::byte> head) {
  if (starts_with(head, "\x89PNG\r\n\x1a\n")) return ImageFormat::Png;
  if (starts_with(head, "\xff\xd8\xff")) return ImageFormat::Jpeg;
  if (starts_with(head, "RIFF") && starts_with(head, "WEBP", 8)) return ImageFormat::WebP;
  return ImageFormat::Unknown;
}

namespace codecs {

bool is_metadata_key(std::string_view key) {
  if (key.empty() || key.size() > 79) return false;
  for (char c : key)
    if (c < 0x20 || c > 0x7e || c == '=') return false;
  return key.front() != ' ' && key.back() != ' ' && key.find("  ") == std::string_view::npos;
}

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = uint8_t(s[i]);
    int extra;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xc2 && b <= 0xdf) {
      extra = 1, cp = b & 0x1f;
    } else if (b >= 0xe0 && b <= 0xef) {
      extra = 2, cp = b & 0x0f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      extra = 3, cp = b & 0x07;
    } else {
      return false;
    }
    if (s.size() - i <= size_t(extra)) return false;
    for (int k = 1; k <= extra; ++k) {
      const auto c = uint8_t(s[i + k]);
      if ((c & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3f);
    }
    const uint32_t smallest[] = {0, 0x80, 0x800, 0x10000};
    if (cp < smallest[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += size_t(extra) + 1;
  }
  return true;
}

std::string latin1_to_utf8(std::string_view text) {
  std::string out;
  for (char ch : text) {
    const auto c = uint8_t(ch);
    if (c < 0x80) {
      out += char(c);
    } else {
      out += char(0xc0 | (c >> 6));
      out += char(0x80 | (c & 0x3f));
    }
  }
  return out;
}

void check_image_size(const std::string& name, int64_t width, int64_t height,
                      const ImageLimits& limits) {
  check(width > 0 && height > 0, name, ": image has no pixels (", width, "x", height, ")");
  check(width <= limits.max_side && height <= limits.max_side &&
            width * height <= limits.max_pixels,
        name, ": image of ", width, "x", height, " pixels is larger than the limit (",
        limits.max_side, " pixels per side, ", limits.max_pixels, " pixels in all)");
}

}  // namespace codecs

Image decode_image(std::span<const std::byte> data, const std::string& name,
                   const ImageLimits& limits) {
  return decode_any(data, name, limits, nullptr);
}

Image load_image(const fs::path& path, const ImageLimits& limits) {
  MappedFile file(path);
  return decode_any({file.data(), file.size()}, path.string(), limits, nullptr);
}

ImageMetadata read_image_metadata(const fs::path& path, const ImageLimits& limits) {
  MappedFile file(path);
  ImageMetadata metadata;
  decode_any({file.data(), file.size()}, path.string(), limits, &metadata);
  return metadata;
}

void check_metadata_key(const std::string& where, std::string_view key) {
  check(codecs::is_metadata_key(key), where, ": metadata key '", key,
        "' is not 1 to 79 printable ASCII characters without '=', leading, trailing or doubled "
        "spaces");
}

void save_png(const fs::path& path, const Image& image, const ImageMetadata& metadata) {
  const std::string where = path.string();
  check_writable(where, image);
  check_metadata(where, metadata);
  AtomicFile file(path);
  codecs::encode_png(file.stream(), where, image, metadata);
  file.commit();
}

std::string png_bytes(const Image& image, const ImageMetadata& metadata,
                      const std::string& name) {
  check_writable(name, image);
  check_metadata(name, metadata);
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = ::open_memstream(&buffer, &size);
  check(out != nullptr, "cannot encode ", name, ": out of memory");
  try {
    codecs::encode_png(out, name, image, metadata);
  } catch (...) {
    std::fclose(out);
    std::free(buffer);
    throw;
  }
  const bool closed = std::fclose(out) == 0;  // sets buffer and size
  std::string bytes = closed && buffer ? std::string(buffer, size) : std::string();
  std::free(buffer);
  check(closed, "cannot encode ", name, ": out of memory");
  return bytes;
}

void save_jpeg(const fs::path& path, const Image& image, int quality,
               const ImageMetadata& metadata) {
  const std::string where = path.string();
  check_writable(where, image);
  check(quality >= 1 && quality <= 100, "cannot write ", where, ": JPEG quality ", quality,
        " is outside 1..100");
  check_metadata(where, metadata);
  AtomicFile file(path);
  codecs::encode_jpeg(file.stream(), where, image, quality, metadata);
  file.commit();
}

void save_webp(const fs::path& path, const Image& image) {
  const std::string where = path.string();
  check_writable(where, image);
  check(image.width <= 16383 && image.height <= 16383, "cannot write ", where, ": image is ",
        image.width, "x", image.height, "; WebP allows at most 16383 on a side");
  AtomicFile file(path);
  codecs::encode_webp(file.stream(), where, image);
  file.commit();
}

bool is_image_name(const fs::path& path) {
  const std::string ext = lowercase_extension(path);
  return ext == ".png" || ext == ".jpg" || ext == ".jpeg" || ext == ".webp";
}

void save_image(const fs::path& path, const Image& image, const ImageMetadata& metadata,
                int jpeg_quality) {
  const std::string ext = lowercase_extension(path);
  if (ext == ".png") return save_png(path, image, metadata);
  if (ext == ".jpg" || ext == ".jpeg") return save_jpeg(path, image, jpeg_quality, metadata);
  if (ext == ".webp") return save_webp(path, image);
  fail("cannot write ", path.string(), ": unknown image extension '", path.extension().string(),
       "' (expected .png, .jpg, .jpeg or .webp)");
}

}  // namespace klein
