#pragma once
// EXIF orientation: cameras store the picture as the sensor saw it and say in EXIF tag 0x0112
// how to turn it upright. The official pipelines load images through diffusers' load_image,
// which applies it (PIL's ImageOps.exif_transpose), so the decoders here apply it too.
#include <cstddef>
#include <span>

#include "formats/image/image.h"

namespace klein::codecs {

// The orientation (1..8) in an EXIF block (the TIFF structure that follows "Exif\0\0" in a
// JPEG APP1 segment, or a PNG eXIf or WebP EXIF chunk); 1 (upright) when absent, out of range
// or malformed: a broken EXIF block never stops an image from loading.
int exif_orientation(std::span<const std::byte> tiff);

// The image turned upright for an orientation, as PIL's exif_transpose: 2 mirror left-right,
// 3 rotate 180, 4 mirror top-bottom, 5 transpose, 6 rotate 90 clockwise, 7 transverse,
// 8 rotate 90 counter-clockwise (5-8 swap width and height). 1 and others: unchanged.
Image apply_orientation(Image image, int orientation);

}  // namespace klein::codecs
