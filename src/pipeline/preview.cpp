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

// The same fit for the FLUX.1 VAE's 16 channels (ComfyUI's Flux latent format), in the scaled
// space the transformer works in ((z − shift) · scale): Z-Image's latents.
constexpr int kFlux1Channels = 16;
constexpr std::array<std::array<float, 3>, kFlux1Channels> kFlux1Factors = {{
    {-0.0346f, 0.0244f, 0.0681f},  {0.0034f, 0.0210f, 0.0687f},   {0.0275f, -0.0668f, -0.0433f},
    {-0.0174f, 0.0160f, 0.0617f},  {0.0859f, 0.0721f, 0.0329f},   {0.0004f, 0.0383f, 0.0115f},
    {0.0405f, 0.0861f, 0.0915f},   {-0.0236f, -0.0185f, -0.0259f}, {-0.0245f, 0.0250f, 0.1180f},
    {0.1008f, 0.0755f, -0.0421f},  {-0.0515f, 0.0201f, 0.0011f},  {0.0428f, -0.0012f, -0.0036f},
    {0.0817f, 0.0765f, 0.0749f},   {-0.1264f, -0.0522f, -0.1103f}, {-0.0280f, -0.0881f, -0.0499f},
    {-0.1262f, -0.0982f, -0.0778f},
}};

uint8_t to_byte(float v) {
  const float u = std::clamp((v + 1.0f) * 0.5f, 0.0f, 1.0f);
  return uint8_t(std::lround(u * 255.0f));
}

}  // namespace

Image latent_preview(const Tensor& tokens, LatentGrid grid) {
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
                   LatentGrid grid) {
  check(latents_in.shape() == velocity.shape(), "preview: latents ",
        shape_str(latents_in.shape()), " and velocity ", shape_str(velocity.shape()), " differ");
  Tensor x0(latents_in.shape());
  for (int64_t i = 0; i < x0.numel(); ++i)
    x0.data()[i] = latents_in.data()[i] - sigma * velocity.data()[i];
  return latent_preview(x0, grid);
}

Image flux1_latent_preview(const Tensor& latents) {
  check(latents.shape().size() == 3 && latents.dim(0) == kFlux1Channels,
        "preview: expected latents [16, h, w], got ", shape_str(latents.shape()));
  const int64_t h = latents.dim(1), w = latents.dim(2), plane = h * w;
  Image image(static_cast<int>(w), static_cast<int>(h));
  for (int64_t i = 0; i < plane; ++i) {
    std::array<float, 3> rgb = kBias;
    for (int k = 0; k < kFlux1Channels; ++k)
      for (int j = 0; j < 3; ++j)
        rgb[size_t(j)] += kFlux1Factors[size_t(k)][size_t(j)] * latents.data()[k * plane + i];
    uint8_t* p = image.pixel(int(i % w), int(i / w));
    for (int j = 0; j < 3; ++j) p[j] = to_byte(rgb[size_t(j)]);
  }
  return image;
}

Image flux1_step_preview(const Tensor& latents_in, const Tensor& velocity, float sigma) {
  check(latents_in.shape() == velocity.shape(), "preview: latents ",
        shape_str(latents_in.shape()), " and velocity ", shape_str(velocity.shape()), " differ");
  Tensor x0(latents_in.shape());
  for (int64_t i = 0; i < x0.numel(); ++i)
    x0.data()[i] = latents_in.data()[i] - sigma * velocity.data()[i];
  return flux1_latent_preview(x0);
}

}  // namespace klein
