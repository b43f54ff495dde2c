#include "pipeline/preview.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"

namespace klein {

namespace {

constexpr int kChannels = 32;  // VAE latent channels; a token packs 2x2 positions of them

// Red, green, blue weight of each latent channel, and the offset (ComfyUI's FLUX.2 latent
// format publishes this least-squares fit).
constexpr std::array<std::array<float, 3>, kChannels> kFactors = {{
    {0.0058f, 0.0113f, 0.0073f},    {0.0495f, 0.0443f, 0.0836f},
    {-0.0099f, 0.0096f, 0.0644f},   {0.2144f, 0.3009f, 0.3652f},
    {0.0166f, -0.0039f, -0.0054f},  {0.0157f, 0.0103f, -0.0160f},
    {-0.0398f, 0.0902f, -0.0235f},  {-0.0052f, 0.0095f, 0.0109f},
    {-0.3527f, -0.2712f, -0.1666f}, {-0.0301f, -0.0356f, -0.0180f},
    {-0.0107f, 0.0078f, 0.0013f},   {0.0746f, 0.0090f, -0.0941f},
    {0.0156f, 0.0169f, 0.0070f},    {-0.0034f, -0.0040f, -0.0114f},
    {0.0032f, 0.0181f, 0.0080f},    {-0.0939f, -0.0008f, 0.0186f},
    {0.0018f, 0.0043f, 0.0104f},    {0.0284f, 0.0056f, -0.0127f},
    {-0.0024f, -0.0022f, -0.0030f}, {0.1207f, -0.0026f, 0.0065f},
    {0.0128f, 0.0101f, 0.0142f},    {0.0137f, -0.0072f, -0.0007f},
    {0.0095f, 0.0092f, -0.0059f},   {0.0000f, -0.0077f, -0.0049f},
    {-0.0465f, -0.0204f, -0.0312f}, {0.0095f, 0.0012f, -0.0066f},
    {0.0290f, -0.0034f, 0.0025f},   {0.0220f, 0.0169f, -0.0048f},
    {-0.0332f, -0.0457f, -0.0468f}, {-0.0085f, 0.0389f, 0.0609f},
    {-0.0076f, 0.0003f, -0.0043f},  {-0.0111f, -0.0460f, -0.0614f},
}};
constexpr std::array<float, 3> kBias = {-0.0329f, -0.0718f, -0.0851f};

uint8_t to_byte(float v) {
  const float u = std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f);
  return uint8_t(std::lround(u * 255.0f));
}

}  // namespace

Image latent_preview(const Tensor& tokens, flux2::LatentGrid grid) {
  check(tokens.shape().size() == 2 && tokens.dim(0) == grid.tokens() &&
            tokens.dim(1) == 4 * kChannels,
        "preview: expected packed latents [", grid.tokens(), ", ", 4 * kChannels, "], got ",
        shape_str(tokens.shape()));
  Image image(int(2 * grid.cols), int(2 * grid.rows));
  for (int64_t r = 0; r < grid.rows; ++r)
    for (int64_t c = 0; c < grid.cols; ++c) {
      // Channel k of the sub-position (dy, dx) is packed at k·4 + dy·2 + dx.
      const float* z = tokens.row(r * grid.cols + c);
      for (int sub = 0; sub < 4; ++sub) {
        std::array<float, 3> rgb = kBias;
        for (int k = 0; k < kChannels; ++k)
          for (int j = 0; j < 3; ++j) rgb[size_t(j)] += kFactors[size_t(k)][size_t(j)] * z[k * 4 + sub];
        uint8_t* p = image.pixel(int(2 * c + sub % 2), int(2 * r + sub / 2));
        for (int j = 0; j < 3; ++j) p[j] = to_byte(rgb[size_t(j)]);
      }
    }
  return image;
}

Image step_preview(const Tensor& latents_in, const Tensor& velocity, float sigma,
                   flux2::LatentGrid grid) {
  check(latents_in.shape() == velocity.shape(), "preview: latents ",
        shape_str(latents_in.shape()), " and velocity ", shape_str(velocity.shape()), " differ");
  Tensor x0(latents_in.shape());
  for (int64_t i = 0; i < x0.numel(); ++i)
    x0.data()[i] = latents_in.data()[i] - sigma * velocity.data()[i];
  return latent_preview(x0, grid);
}

}  // namespace klein
