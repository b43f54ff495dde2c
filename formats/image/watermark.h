#pragma once
// The invisible watermark of the `invisible-watermark` Python library's "dwtDct" method (the
// one BFL's and Stability's reference code call), on 8-bit RGB images: marks this file writes
// are read by that library's decoder, and marks it writes are read here.
//
// The method, as the library does it on an OpenCV BGR uint8 image:
//   - colour: OpenCV's integer BGR->YUV (BT.601, 14-bit fixed point); only U carries the mark
//     (the library's scales are Y 0, U 36, and V is never visited)
//   - the top-left rows x cols of U, each floored to a multiple of 4, go through one level of
//     the Haar DWT (PyWavelets' float64 arithmetic); its LL band is cut into 4x4 blocks,
//     taken row by row
//   - block k carries bit k mod n of the n-bit message: among the block's 15 coefficients
//     other than its top-left one, the largest in magnitude becomes
//     (floor(v / 36) + 0.25 + 0.5 * bit) * 36 (no DCT: the library's dwtDct quantises the
//     LL value itself)
//   - inverse DWT with the horizontal and vertical detail bands exchanged (as the library
//     passes them), cast to uint8 (truncation), OpenCV's integer YUV->BGR for the whole image
//   - decoding: the same LL blocks, the largest coefficient again, the bit is
//     (v mod 36) > 18; bit i is 1 when the mean over its blocks, times 255, exceeds 127
//   - images with fewer than 256 x 256 pixels are refused by the library (either way)
//
// embed_watermark gives the library's pixels bit for bit, with two differences, both in the
// rare blocks where the library's own mark does not read back: a U value outside 0..255 is
// clamped (the library's cast wraps it around), and a block whose mark the decoder would
// misread (the largest coefficient changed places, or the colour round trip moved it) is
// embedded again at the nearest quantisation level, or in the next largest coefficient,
// that reads back right. docs/WATERMARK.md has the measurements.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "formats/image/image.h"

namespace klein {

// The least number of pixels the method marks (the library's limit: 256 x 256).
inline constexpr int64_t kWatermarkMinPixels = int64_t(256) * 256;

// BFL's message (flux2's src/flux2/watermark.py): the 48-digit binary literal
// 0b001010101111111010000111100111001111010100101110, of which bin() keeps 46 digits (the two
// leading zeros go), so the library embeds these 46 bits, most significant first.
std::span<const uint8_t> flux_watermark_bits();
// The same as a string of '0' and '1'.
std::string bits_text(std::span<const uint8_t> bits);

// Whether a width x height image is large enough to carry a mark.
bool watermark_fits(int64_t width, int64_t height);

struct WatermarkStats {
  int64_t blocks = 0;      // 4x4 LL blocks, each carrying one bit
  int64_t corrected = 0;   // blocks embedded again because the library's way read back wrong
  int64_t unreadable = 0;  // blocks no candidate made read back right (left as the library's)
};

// Marks `image` in place with `bits` (each 0 or 1, 1 to 1024 of them). Throws klein::Error
// when the image is smaller than kWatermarkMinPixels.
WatermarkStats embed_watermark(Image& image, std::span<const uint8_t> bits);

struct WatermarkReading {
  std::vector<uint8_t> bits;  // the decoded message, as the library decides it
  std::vector<int64_t> ones;  // per bit: how many of its blocks read 1
  std::vector<int64_t> votes; // per bit: how many blocks carry it
  int64_t blocks = 0;
};

// Reads an n-bit message from `image` as the library's decoder does. Throws klein::Error when
// the image is smaller than kWatermarkMinPixels or n is not 1 to 1024.
WatermarkReading read_watermark(const Image& image, size_t n);

}  // namespace klein
