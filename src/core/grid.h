#pragma once
// The grid of image tokens a transformer denoises: rows x cols tokens (one token per 16x16
// pixels in FLUX.2 and in Z-Image). What the pipeline's stages, previews and the report tell a
// family's networks the image's shape is, without knowing the family.
#include <cstdint>

namespace klein {

struct LatentGrid {
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t tokens() const { return rows * cols; }
};

}  // namespace klein
