#pragma once
// The PNG, JPEG and WebP codecs behind image.h. Each codec keeps its C library's error handling
// (setjmp/longjmp) inside its own file and reports failures as klein::Error.
#include <cstdio>
#include <span>
#include <string>
#include <string_view>

#include "formats/image/image.h"

namespace klein::codecs {

// Throws if a width x height image is empty or exceeds `limits`; `name` is the file.
void check_image_size(const std::string& name, int64_t width, int64_t height,
                      const ImageLimits& limits);

// Metadata text helpers shared by the codecs.
bool is_metadata_key(std::string_view key);  // the key rules of image.h
bool is_valid_utf8(std::string_view text);
std::string latin1_to_utf8(std::string_view text);

// Decoders: `metadata`, if given, receives the file's text chunks / comments.
Image decode_png(std::span<const std::byte> data, const std::string& name,
                 const ImageLimits& limits, ImageMetadata* metadata);
Image decode_jpeg(std::span<const std::byte> data, const std::string& name,
                  const ImageLimits& limits, ImageMetadata* metadata);
Image decode_webp(std::span<const std::byte> data, const std::string& name,
                  const ImageLimits& limits, ImageMetadata* metadata);

// Encoders write to an open stream (an AtomicFile's); `name` is the output for messages.
void encode_png(std::FILE* out, const std::string& name, const Image& image,
                const ImageMetadata& metadata);
void encode_jpeg(std::FILE* out, const std::string& name, const Image& image, int quality,
                 const ImageMetadata& metadata);
// Lossless; WebP carries no text metadata of ours.
void encode_webp(std::FILE* out, const std::string& name, const Image& image);

}  // namespace klein::codecs
