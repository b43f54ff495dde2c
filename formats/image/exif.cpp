#include "formats/image/exif.h"

#include <cstdint>
#include <cstring>
#include <utility>

namespace klein::codecs {

int exif_orientation(std::span<const std::byte> tiff) {
  // TIFF header: byte order "II" (little-endian) or "MM" (big-endian), 42, offset of IFD0.
  if (tiff.size() < 8) return 1;
  const auto byte = [&](size_t i) { return std::to_integer<uint32_t>(tiff[i]); };
  bool little;
  if (byte(0) == 'I' && byte(1) == 'I')
    little = true;
  else if (byte(0) == 'M' && byte(1) == 'M')
    little = false;
  else
    return 1;
  const auto u16 = [&](size_t at) {
    return little ? byte(at) | byte(at + 1) << 8 : byte(at) << 8 | byte(at + 1);
  };
  const auto u32 = [&](size_t at) {
    return little ? u16(at) | u16(at + 2) << 16 : u16(at) << 16 | u16(at + 2);
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > tiff.size() || tiff.size() - ifd < 2) return 1;
  const size_t entries = u16(ifd);
  // Each entry: tag (2), type (2), count (4), value or offset (4).
  for (size_t i = 0; i < entries; ++i) {
    const size_t at = ifd + 2 + 12 * i;
    if (at > tiff.size() || tiff.size() - at < 12) return 1;
    if (u16(at) != 0x0112) continue;
    // SHORT (type 3), one value, stored in the first two bytes of the value field.
    if (u16(at + 2) != 3 || u32(at + 4) != 1) return 1;
    const uint32_t v = u16(at + 8);
    return v >= 1 && v <= 8 ? int(v) : 1;
  }
  return 1;
}

Image apply_orientation(Image in, int orientation) {
  if (orientation < 2 || orientation > 8) return in;
  const int w = in.width, h = in.height;
  const bool swap = orientation >= 5;
  Image out(swap ? h : w, swap ? w : h);
  for (int oy = 0; oy < out.height; ++oy) {
    for (int ox = 0; ox < out.width; ++ox) {
      int x = ox, y = oy;  // the source pixel of (ox, oy)
      switch (orientation) {
        case 2: x = w - 1 - ox; break;
        case 3: x = w - 1 - ox, y = h - 1 - oy; break;
        case 4: y = h - 1 - oy; break;
        case 5: x = oy, y = ox; break;
        case 6: x = oy, y = h - 1 - ox; break;
        case 7: x = w - 1 - oy, y = h - 1 - ox; break;
        case 8: x = w - 1 - oy, y = ox; break;
      }
      std::memcpy(out.pixel(ox, oy), in.pixel(x, y), 3);
    }
  }
  return out;
}

}  // namespace klein::codecs
