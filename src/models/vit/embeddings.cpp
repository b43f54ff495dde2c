// ViTEmbeddings (transformers' modeling_vit.py, no interpolation: the image is image_size):
//   patches[p, (c, ky, kx)] = pixels[c, gy * P + ky, gx * P + kx]   p = gy * G + gx, row-major
//   x[0]     = cls_token + position_embeddings[0]
//   x[1 + p] = patches[p] · Wᵀ + b + position_embeddings[1 + p]     W [D, C, P, P] as [D, C·P·P]
#include "models/vit/embeddings.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "models/vit/weights.h"
#include "ops/linear.h"

namespace klein::vit {

void embed(const WeightUnit& unit, const VitConfig& c, const Tensor& pixel_values, Tensor& x,
           Compute& cx) {
  const int64_t C = c.channels, P = c.patch_size, G = c.grid(), S = c.image_size;
  const int64_t D = c.hidden, T = c.tokens(), K = c.patch_values();
  check(pixel_values.shape() == Shape{C, S, S}, "safety classifier: pixel values of shape ",
        shape_str(pixel_values.shape()), "; expected ", shape_str({C, S, S}));
  check(x.shape() == Shape{T, D}, "internal: token buffer ", shape_str(x.shape()));

  // The patches as rows [G*G, C*P*P], in the weight's (c, ky, kx) order.
  Tensor patches({G * G, K});
  const float* px = pixel_values.data();
  cx.pool().parallel_for(G * G, [&](int64_t p0, int64_t p1, int) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t gy = p / G, gx = p % G;
      float* row = patches.row(p);
      for (int64_t ch = 0; ch < C; ++ch)
        for (int64_t ky = 0; ky < P; ++ky)
          std::memcpy(row + (ch * P + ky) * P, px + (ch * S + gy * P + ky) * S + gx * P,
                      size_t(P) * sizeof(float));
    }
  }, 8);

  const Weight& w = shaped(unit, "patch_embeddings.projection.weight", {D, C, P, P});
  const std::vector<float> bias = floats(unit, "patch_embeddings.projection.bias", {D});
  const std::vector<float> cls = floats(unit, "cls_token", {1, 1, D});
  const std::vector<float> pos = floats(unit, "position_embeddings", {1, T, D});

  // The convolution's weight read as the matrix [D, C·P·P] it is in memory.
  ops::linear(patches.data(), G * G, K, ops::as_matrix(w), x.row(1), D, cx);  // rows 1..T-1
  ops::add_bias(x.row(1), G * G, D, D, bias.data());
  std::memcpy(x.row(0), cls.data(), size_t(D) * sizeof(float));
  float* t = x.data();
  for (int64_t i = 0; i < T * D; ++i) t[i] += pos[size_t(i)];
}

}  // namespace klein::vit
