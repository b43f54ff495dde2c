#pragma once
// Image files: 8-bit RGB images in memory, PNG/JPEG reading (format chosen by content) and
// writing with text metadata. Every writer is atomic: a failed save leaves no file behind.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace klein {

// An 8-bit RGB image, rows top to bottom, pixels interleaved R, G, B.
struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3 bytes

  Image() = default;
  Image(int width, int height);  // black

  size_t row_bytes() const { return size_t(width) * 3; }
  uint8_t* row(int y) { return rgb.data() + size_t(y) * row_bytes(); }
  const uint8_t* row(int y) const { return rgb.data() + size_t(y) * row_bytes(); }
  uint8_t* pixel(int x, int y) { return row(y) + size_t(x) * 3; }
  const uint8_t* pixel(int x, int y) const { return row(y) + size_t(x) * 3; }
};

// Key/value text pairs in file order. Keys are 1-79 printable ASCII characters without '=',
// leading, trailing or doubled spaces (the PNG keyword rules, plus '=' which separates key and
// value in JPEG comments); values are UTF-8.
using ImageMetadata = std::vector<std::pair<std::string, std::string>>;

// The key of an XMP packet among the metadata (XMP's own PNG keyword): PNG stores it as the
// uncompressed iTXt chunk XMP readers look for, JPEG as an APP1 segment with the XMP namespace
// header (at most 65504 bytes); both are read back under the same key. Its value is the
// packet as the caller wrote it.
inline constexpr const char* kXmpKey = "XML:com.adobe.xmp";

// Sizes refused before any pixel memory is allocated, so that a small file claiming a huge
// image (a decompression bomb) fails fast instead of exhausting memory.
struct ImageLimits {
  int max_side = 16384;
  int64_t max_pixels = int64_t(64) << 20;  // 64 megapixels
};

enum class ImageFormat { Unknown, Png, Jpeg, WebP };

// The format of a file from its first bytes (never from its name).
ImageFormat sniff_image_format(std::span<const std::byte> head);

// Reads a PNG, JPEG or WebP file as 8-bit RGB. PNG: any bit depth, colour type and interlacing;
// 16-bit samples keep their high byte, alpha is dropped without compositing (as PIL's
// convert("RGB")). JPEG: baseline or progressive, grayscale, colour, CMYK or YCCK (as Pillow
// converts them). WebP: still images, lossy or lossless, alpha dropped; animations refused.
// Corrupt, truncated or oversized files throw klein::Error naming the file.
Image load_image(const std::filesystem::path& path, const ImageLimits& limits = {});
// The same from bytes in memory; `name` is used in error messages.
Image decode_image(std::span<const std::byte> data, const std::string& name,
                   const ImageLimits& limits = {});

// The text metadata of a PNG (tEXt, zTXt, iTXt) or JPEG (COM markers, an XMP APP1 segment)
// file, in file order.
// JPEG comments of the form "key=value" are split; other comments get the key "comment".
ImageMetadata read_image_metadata(const std::filesystem::path& path,
                                  const ImageLimits& limits = {});

// PNG, 8-bit RGB; ASCII values go into tEXt chunks, others into iTXt (UTF-8).
void save_png(const std::filesystem::path& path, const Image& image,
              const ImageMetadata& metadata = {});
// Baseline JPEG of the given quality (1-100), chroma not subsampled (4:4:4); each pair becomes
// a "key=value" COM marker.
void save_jpeg(const std::filesystem::path& path, const Image& image, int quality = 95,
               const ImageMetadata& metadata = {});
// The bytes of that PNG file, in memory (for a network reply); `name` is for messages.
std::string png_bytes(const Image& image, const ImageMetadata& metadata = {},
                      const std::string& name = "image");
// Lossless WebP (the exact pixels); WebP carries no text metadata.
void save_webp(const std::filesystem::path& path, const Image& image);
// Whether save_image writes `path`'s format: .png, .jpg, .jpeg or .webp, any case (for front ends
// that check an output name before the long work).
bool is_image_name(const std::filesystem::path& path);
// PNG, JPEG or WebP chosen by the extension of `path` (.png, .jpg, .jpeg, .webp; any case);
// metadata goes into PNG and JPEG only.
void save_image(const std::filesystem::path& path, const Image& image,
                const ImageMetadata& metadata = {}, int jpeg_quality = 95);

// Throws unless `key` follows the key rules above; `where` names the output for the message.
void check_metadata_key(const std::string& where, std::string_view key);

}  // namespace klein
