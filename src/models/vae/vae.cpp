#include "models/vae/vae.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "models/vae/decoder.h"
#include "models/vae/encoder.h"
#include "ops/finite.h"

namespace klein::vae {

namespace {

void report(const Observer& observe, const std::string& name, const Tensor& value) {
  if (observe) observe(name, value);
}

}  // namespace

Vae::Vae(WeightStore& store, Compute& cx, VaeMemory memory)
    : store_(store), cx_(cx), memory_(std::move(memory)) {
  if (!config().latent_batch_norm) return;  // the FLUX.1 VAE (Z-Image): the decoder alone
  const UnitRef unit = store_.acquire("vae.latent_stats");
  stats_ = load_latent_stats(*unit, config());
}

int64_t Vae::pixels_per_latent() const {
  return int64_t(1) << (config().block_out_channels.size() - 1);
}

int64_t Vae::pixels_per_token() const { return pixels_per_latent() * config().patch_size[0]; }

Tensor Vae::tokens_to_latent(const Tensor& tokens, int64_t h, int64_t w,
                             const Observer& observe) const {
  check(tokens.shape().size() == 2 && tokens.dim(1) == config().packed_channels(),
        "VAE decode: tokens are ", shape_str(tokens.shape()), ", expected [", h * w, ", ",
        config().packed_channels(), "]");
  Tensor packed = unpack_tokens(tokens, h, w);
  report(observe, "unpacked", packed);
  denormalize_latent(packed, stats_);
  report(observe, "denormalized", packed);
  Tensor z = unpatchify(packed, config().patch_size);
  report(observe, "unpatchified", z);
  return z;
}

Tensor Vae::decode_latent(const Tensor& z, const Observer& observe) const {
  const UnitRef unit = store_.acquire("vae.decoder");
  Tensor image = run_decoder(*unit, config(), z, cx_, observe, memory_);
  ops::require_finite(image.data(), image.numel(), "the VAE decoder's output", cx_);
  report(observe, "image", image);
  return image;
}

Tensor Vae::decode(const Tensor& tokens, int64_t h, int64_t w, const Observer& observe) const {
  return decode_latent(tokens_to_latent(tokens, h, w, observe), observe);
}

Tensor Vae::encode_moments(const Tensor& pixels, const Observer& observe) const {
  const int64_t multiple = pixels_per_token();
  check(pixels.shape().size() == 3 && pixels.dim(0) == config().in_channels,
        "VAE encode: expected an image [", config().in_channels, ", H, W], got ",
        shape_str(pixels.shape()));
  check(pixels.dim(1) % multiple == 0 && pixels.dim(2) % multiple == 0 && pixels.dim(1) > 0 &&
            pixels.dim(2) > 0,
        "VAE encode: image is ", pixels.dim(2), "x", pixels.dim(1), " (WxH); both sides must be ",
        "positive multiples of ", multiple);
  const UnitRef unit = store_.acquire("vae.encoder");
  return run_encoder(*unit, config(), pixels, cx_, observe, memory_);
}

Tensor Vae::encode_mean(const Tensor& pixels, const Observer& observe) const {
  const Tensor moments = encode_moments(pixels, observe);
  // The pipeline takes the distribution's mode, the mean: the first latent_channels channels.
  const int64_t latent = config().latent_channels;
  Tensor mean({latent, moments.dim(1), moments.dim(2)});
  std::memcpy(mean.data(), moments.data(), size_t(mean.numel()) * sizeof(float));
  report(observe, "vae_mean", mean);
  return mean;
}

Vae::Posterior Vae::encode_posterior(const Tensor& pixels, const Observer& observe) const {
  const Tensor moments = encode_moments(pixels, observe);
  const int64_t latent = config().latent_channels;
  check(moments.dim(0) == 2 * latent, "VAE encode: the encoder gave ", moments.dim(0),
        " channels; a posterior needs ", 2 * latent, " (mean and log-variance)");
  Posterior p{Tensor({latent, moments.dim(1), moments.dim(2)}),
              Tensor({latent, moments.dim(1), moments.dim(2)})};
  const int64_t n = p.mean.numel();
  std::memcpy(p.mean.data(), moments.data(), size_t(n) * sizeof(float));
  const float* logvar = moments.data() + n;
  for (int64_t i = 0; i < n; ++i)
    p.std.data()[i] = std::exp(0.5f * std::clamp(logvar[i], -30.0f, 20.0f));
  report(observe, "vae_mean", p.mean);
  report(observe, "vae_std", p.std);
  return p;
}

Tensor Vae::latent_to_tokens(const Tensor& mean, const Observer& observe) const {
  Tensor packed = patchify(mean, config().patch_size);
  report(observe, "patchified", packed);
  normalize_latent(packed, stats_);
  report(observe, "normalized", packed);
  Tensor tokens = pack_tokens(packed);
  report(observe, "tokens", tokens);
  return tokens;
}

Tensor Vae::encode(const Tensor& pixels, const Observer& observe) const {
  return latent_to_tokens(encode_mean(pixels, observe), observe);
}

}  // namespace klein::vae
