// WebP through libwebp: still images, lossy or lossless, decoded to RGB with libwebp's own
// conversion (the one Pillow uses, so the pixels are Pillow's); alpha is dropped, as
// convert("RGB") drops it. An EXIF orientation (the EXIF chunk of an extended file) is
// applied, as for JPEG and PNG. Written lossless: the exact pixels, like PNG, in fewer bytes.
#include <webp/decode.h>
#include <webp/demux.h>
#include <webp/encode.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <utility>

#include "core/error.h"
#include "formats/image/codecs.h"
#include "formats/image/exif.h"

namespace klein::codecs {

namespace {

const char* status_text(VP8StatusCode status) {
  switch (status) {
    case VP8_STATUS_OK: return "ok";
    case VP8_STATUS_OUT_OF_MEMORY: return "out of memory";
    case VP8_STATUS_INVALID_PARAM: return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR: return "the bitstream is corrupt";
    case VP8_STATUS_UNSUPPORTED_FEATURE: return "it uses a feature libwebp does not support";
    case VP8_STATUS_SUSPENDED: return "decoding was suspended";
    case VP8_STATUS_USER_ABORT: return "decoding was aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA: return "file is truncated";
  }
  return "unknown error";
}

// The EXIF orientation of an extended WebP's EXIF chunk; 1 without one. libwebp's demuxer
// (the one Pillow reads the chunk with) takes the chunk only when the VP8X header's EXIF flag
// is set, and refuses a container whose chunks overrun the file: then the image stays as
// stored, as a broken EXIF block in a JPEG leaves it. Some writers put JPEG's "Exif\0\0"
// before the TIFF structure, as in PNG; the specification does not: both are read.
int orientation_of(std::span<const std::byte> data) {
  const WebPData whole{reinterpret_cast<const uint8_t*>(data.data()), data.size()};
  WebPDemuxer* demux = WebPDemux(&whole);
  if (!demux) return 1;
  int orientation = 1;
  WebPChunkIterator chunk;
  if (WebPDemuxGetChunk(demux, "EXIF", 1, &chunk)) {
    auto tiff = std::as_bytes(std::span(chunk.chunk.bytes, chunk.chunk.size));
    if (tiff.size() >= 6 && std::memcmp(tiff.data(), "Exif\0\0", 6) == 0) tiff = tiff.subspan(6);
    orientation = exif_orientation(tiff);
    WebPDemuxReleaseChunkIterator(&chunk);
  }
  WebPDemuxDelete(demux);
  return orientation;
}

}  // namespace

Image decode_webp(std::span<const std::byte> data, const std::string& name,
                  const ImageLimits& limits, ImageMetadata* metadata) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(data.data());
  WebPBitstreamFeatures features;
  const VP8StatusCode status = WebPGetFeatures(bytes, data.size(), &features);
  check(status == VP8_STATUS_OK, name, ": cannot read WebP: ", status_text(status));
  check(!features.has_animation, name,
        ": an animated WebP; expected a still image (save one frame as PNG, JPEG or WebP)");
  // The declared size is checked before any pixel memory exists (decompression bombs).
  check_image_size(name, features.width, features.height, limits);
  Image image(features.width, features.height);
  const int stride = features.width * 3;
  const uint8_t* out = WebPDecodeRGBInto(bytes, data.size(), image.rgb.data(), image.rgb.size(), stride);
  check(out != nullptr, name, ": cannot read WebP: the image data is corrupt or truncated");
  if (metadata) metadata->clear();  // WebP has no text chunks that we read
  return apply_orientation(std::move(image), orientation_of(data));
}

void encode_webp(std::FILE* out, const std::string& name, const Image& image) {
  uint8_t* encoded = nullptr;
  const size_t size = WebPEncodeLosslessRGB(image.rgb.data(), image.width, image.height, image.width * 3,
                                            &encoded);
  check(size > 0 && encoded != nullptr, "cannot write ", name, ": the WebP encoder failed (",
        image.width, "x", image.height, "; WebP allows at most 16383 on a side)");
  const bool written = std::fwrite(encoded, 1, size, out) == size;
  WebPFree(encoded);
  check(written, "cannot write ", name, ": write failed");
}

}  // namespace klein::codecs
