// libFuzzer target: PNG/JPEG/WebP decoding with the size limits (decompression bombs refused by
// the declared size), then the reference preprocessing and the mask binarisation every
// decoded image goes through.
#include <cstdint>
#include <span>

#include "core/error.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  klein::ImageLimits limits;
  limits.max_side = 1024;
  limits.max_pixels = 1 << 18;
  try {
    const klein::Image image = klein::decode_image(
        std::as_bytes(std::span(data, size)), "fuzz", limits);
    try {
      (void)klein::prepare_reference(image, "fuzz");
    } catch (const klein::Error&) {
    }
    (void)klein::binary_mask(image, 16, 16);
  } catch (const klein::Error&) {
  }
  return 0;
}
