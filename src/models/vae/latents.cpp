#include "models/vae/latents.h"

#include <cmath>

#include "core/error.h"

namespace klein::vae {

namespace {

void check_chw(const Tensor& t, const char* what) {
  check(t.shape().size() == 3, what, ": expected a [C, h, w] latent, got ", shape_str(t.shape()));
}

void check_stats(const Tensor& packed, const LatentStats& stats) {
  check_chw(packed, "latent statistics");
  check(int64_t(stats.mean.size()) == packed.dim(0) && int64_t(stats.std.size()) == packed.dim(0),
        "latent statistics have ", stats.mean.size(), " channels, the latent has ", packed.dim(0));
}

}  // namespace

Tensor unpack_tokens(const Tensor& tokens, int64_t h, int64_t w) {
  check(tokens.shape().size() == 2 && h > 0 && w > 0 && tokens.dim(0) == h * w,
        "latent tokens are ", shape_str(tokens.shape()), ", expected [", h, "·", w, " = ", h * w,
        ", C] for a ", h, "x", w, " grid");
  const int64_t C = tokens.dim(1);
  Tensor latent({C, h, w});
  for (int64_t p = 0; p < h * w; ++p)
    for (int64_t c = 0; c < C; ++c) latent.data()[c * h * w + p] = tokens.data()[p * C + c];
  return latent;
}

Tensor pack_tokens(const Tensor& latent) {
  check_chw(latent, "pack_tokens");
  const int64_t C = latent.dim(0), P = latent.dim(1) * latent.dim(2);
  Tensor tokens({P, C});
  for (int64_t p = 0; p < P; ++p)
    for (int64_t c = 0; c < C; ++c) tokens.data()[p * C + c] = latent.data()[c * P + p];
  return tokens;
}

Tensor patchify(const Tensor& latent, std::array<int64_t, 2> patch) {
  check_chw(latent, "patchify");
  const auto [ph, pw] = patch;
  const int64_t C = latent.dim(0), H = latent.dim(1), W = latent.dim(2);
  check(H % ph == 0 && W % pw == 0, "patchify: a ", H, "x", W, " latent does not split into ", ph,
        "x", pw, " patches");
  const int64_t h = H / ph, w = W / pw;
  Tensor packed({C * ph * pw, h, w});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t dy = 0; dy < ph; ++dy)
      for (int64_t dx = 0; dx < pw; ++dx) {
        float* out = packed.data() + ((c * ph + dy) * pw + dx) * h * w;
        for (int64_t r = 0; r < h; ++r)
          for (int64_t col = 0; col < w; ++col)
            out[r * w + col] = latent.data()[(c * H + r * ph + dy) * W + col * pw + dx];
      }
  return packed;
}

Tensor unpatchify(const Tensor& packed, std::array<int64_t, 2> patch) {
  check_chw(packed, "unpatchify");
  const auto [ph, pw] = patch;
  check(packed.dim(0) % (ph * pw) == 0, "unpatchify: ", packed.dim(0),
        " channels are not a multiple of ", ph * pw);
  const int64_t C = packed.dim(0) / (ph * pw), h = packed.dim(1), w = packed.dim(2);
  const int64_t H = h * ph, W = w * pw;
  Tensor latent({C, H, W});
  for (int64_t c = 0; c < C; ++c)
    for (int64_t dy = 0; dy < ph; ++dy)
      for (int64_t dx = 0; dx < pw; ++dx) {
        const float* in = packed.data() + ((c * ph + dy) * pw + dx) * h * w;
        for (int64_t r = 0; r < h; ++r)
          for (int64_t col = 0; col < w; ++col)
            latent.data()[(c * H + r * ph + dy) * W + col * pw + dx] = in[r * w + col];
      }
  return latent;
}

LatentStats load_latent_stats(const WeightUnit& unit, const VaeConfig& config) {
  const int64_t C = config.packed_channels();
  const Weight& mean = unit.get("bn.running_mean");
  const Weight& var = unit.get("bn.running_var");
  check(mean.shape == Shape{C} && var.shape == Shape{C}, "tensors ", mean.name, " ",
        shape_str(mean.shape), " and ", var.name, " ", shape_str(var.shape), ": expected [", C,
        "] each");
  LatentStats s;
  s.mean = weight_to_floats(mean);
  s.std = weight_to_floats(var);
  // float32 arithmetic, as the pipeline computes sqrt(running_var + eps) on float32 tensors.
  const float eps = float(config.batch_norm_eps);
  for (float& v : s.std) {
    check(v + eps > 0, "tensor ", var.name, " holds a negative variance ", v);
    v = std::sqrt(v + eps);
  }
  return s;
}

void normalize_latent(Tensor& packed, const LatentStats& stats) {
  check_stats(packed, stats);
  const int64_t P = packed.dim(1) * packed.dim(2);
  for (int64_t c = 0; c < packed.dim(0); ++c) {
    float* x = packed.data() + c * P;
    for (int64_t i = 0; i < P; ++i) x[i] = (x[i] - stats.mean[size_t(c)]) / stats.std[size_t(c)];
  }
}

void denormalize_latent(Tensor& packed, const LatentStats& stats) {
  check_stats(packed, stats);
  const int64_t P = packed.dim(1) * packed.dim(2);
  for (int64_t c = 0; c < packed.dim(0); ++c) {
    float* x = packed.data() + c * P;
    for (int64_t i = 0; i < P; ++i) x[i] = x[i] * stats.std[size_t(c)] + stats.mean[size_t(c)];
  }
}

}  // namespace klein::vae
