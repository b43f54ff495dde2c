// klein vae decode / klein vae encode: the VAE alone, on latents saved as .npy and on images,
// with the model's own VAE (-m) or a tiny autoencoder (--vae-decoder / --vae-encoder, taesd.py's
// TAEF2 or TAEF1: models/taesd), which needs no model.
//
// The latents are in the layouts `klein generate --dump` writes:
//   FLUX.2 (a VAE with batch-norm statistics): the transformer's latents, as tokens
//     [1, h*w, 128] (final_latents) or as [1, 128, h, w] (noise, image_latents), or the
//     decoder's own input [1, 32, 2h, 2w] (vae_input);
//   Z-Image (the FLUX.1 VAE, scaled): the sampler's latents [1, 16, H/8, W/8] (final_latents).
// encode writes [1, 128, h, w] (FLUX.2) or [1, 16, H/8, W/8] (Z-Image). With a tiny autoencoder
// and no model, the latents are its own: [1, C, H/8, W/8] (TAEF2: the FLUX.2 VAE's raw latent,
// C = 32; TAEF1: the scaled FLUX.1 latent, C = 16). With both, the tiny network works on the
// model's latents: its width must be the model VAE's.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/files.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"
#include "models/taesd/taesd.h"
#include "models/vae/latents.h"
#include "models/vae/vae.h"
#include "ops/compute.h"
#include "pipeline/stages.h"
#include "pipeline/tiny_decoder.h"
#include "weights/model_source.h"

namespace klein::cli {
namespace {

namespace fs = std::filesystem;

struct VaeOptions {
  ModelPaths paths;
  fs::path input;  // decode: --latents; encode: the image
  fs::path output;
  fs::path tiny;                  // --vae-decoder / --vae-encoder
  int64_t width = 0, height = 0;  // decode of FLUX.2 tokens that are not a square grid
  int threads = 0;
};

bool has_model(const ModelPaths& p) {
  return !p.model.empty() || !p.diffusion_model.empty() || !p.vae.empty();
}

std::string latent_space(const VaeConfig& vc) {
  return vc.latent_batch_norm ? "FLUX.2's VAE" : "the FLUX.1 VAE of Z-Image";
}

// The tiny decoder under the full VAE's default memory rule (bands above its whole limit), as
// a generation decodes with it.
Tensor tiny_decode(const taesd::TinyDecoder& tiny, const Tensor& z, Compute& cx) {
  const vae::VaeMemory m;
  return tiny.decode(z, cx, {},
                     taesd::TinyDecoder::band_rows_for(z.dim(1), z.dim(2), m.whole_limit,
                                                       m.band_bytes));
}

// [1, ...] → [...]
Tensor without_batch(Tensor t, const fs::path& file, const std::string& expected) {
  check(t.shape().size() >= 2 && t.dim(0) == 1, file.string(), ": latents are ",
        shape_str(t.shape()), ", expected ", expected);
  t.reshape(Shape(t.shape().begin() + 1, t.shape().end()));
  return t;
}

// What --latents holds, read against the model's VAE.
struct ModelLatents {
  enum Kind { Tokens, VaeLatent, Scaled } kind = Tokens;
  Tensor value;  // tokens [h*w, 128], the VAE latent [32, H/8, W/8], or Z-Image's [16, h, w]
  LatentGrid grid;
};

ModelLatents read_model_latents(const VaeOptions& o, const VaeConfig& vc) {
  Tensor t = read_npy(o.input).to_tensor();
  const Shape& s = t.shape();
  const int64_t packed = vc.packed_channels(), latent = vc.latent_channels;
  ModelLatents m;
  if (!vc.latent_batch_norm) {
    const std::string expected = "[1, " + std::to_string(latent) + ", H/8, W/8] (" +
                                 latent_space(vc) + ": the sampler's final_latents)";
    check(s.size() == 4 && s[1] == latent, o.input.string(), ": latents are ", shape_str(s),
          ", expected ", expected);
    m.kind = ModelLatents::Scaled;
    m.value = without_batch(std::move(t), o.input, expected);
    m.grid = {m.value.dim(1), m.value.dim(2)};
    return m;
  }
  const std::string expected = "tokens [1, h*w, " + std::to_string(packed) + "], [1, " +
                               std::to_string(packed) + ", h, w] or the decoder's input [1, " +
                               std::to_string(latent) + ", H/8, W/8] (" + latent_space(vc) + ")";
  if (s.size() == 3 && s[0] == 1 && s[2] == packed) {
    const int64_t n = s[1];
    if (o.width > 0 || o.height > 0) {
      check(o.width % 16 == 0 && o.height % 16 == 0 && (o.width / 16) * (o.height / 16) == n,
            "--width/--height: ", o.width, "x", o.height, " is not the size of ", n,
            " tokens (one per 16x16 pixels)");
      m.grid = {o.height / 16, o.width / 16};
    } else {
      const int64_t side = int64_t(std::llround(std::sqrt(double(n))));
      check(side * side == n, o.input.string(), ": ", n,
            " tokens are not a square grid; give the image's --width and --height");
      m.grid = {side, side};
    }
    m.value = without_batch(std::move(t), o.input, expected);
    return m;
  }
  check(s.size() == 4 && s[0] == 1 && (s[1] == packed || s[1] == latent), o.input.string(),
        ": latents are ", shape_str(s), ", expected ", expected);
  Tensor chw = without_batch(std::move(t), o.input, expected);
  if (chw.dim(0) == packed) {
    m.grid = {chw.dim(1), chw.dim(2)};
    m.value = vae::pack_tokens(chw);
  } else {
    m.kind = ModelLatents::VaeLatent;
    m.value = std::move(chw);
  }
  return m;
}

void run_decode(const VaeOptions& o) {
  check(is_image_name(o.output), "-o ", o.output.string(),
        ": the output must end in .png, .jpg, .jpeg or .webp");
  check_writable_output(o.output, "-o");
  const auto start = std::chrono::steady_clock::now();
  Compute cx(o.threads);
  Tensor image;  // [3, H, W] in [-1, 1]
  std::string by;
  if (!has_model(o.paths)) {
    check(!o.tiny.empty(), "vae decode: give the model (-m) or a tiny decoder (--vae-decoder)");
    const taesd::TinyDecoder tiny(o.tiny);
    const int64_t c = tiny.latent_channels();
    const std::string expected = "[1, " + std::to_string(c) + ", h, w], the latents of " +
                                 o.tiny.filename().string() + " (" +
                                 taesd::describe_latent_width(c) + ")";
    Tensor z = read_npy(o.input).to_tensor();
    check(z.shape().size() == 4 && z.dim(1) == c, o.input.string(), ": latents are ",
          shape_str(z.shape()), ", expected ", expected);
    image = tiny_decode(tiny, without_batch(std::move(z), o.input, expected), cx);
    tiny_output_to_signed(image);
    by = "the tiny decoder " + o.tiny.string();
  } else {
    auto store = open_model(o.paths);
    store->set_residency(Residency::Paged);
    const VaeConfig& vc = store->config().vae;
    ModelLatents m = read_model_latents(o, vc);
    if (!o.tiny.empty()) {
      const taesd::TinyDecoder tiny(o.tiny, vc.latent_channels,
                                    "the latents of " + latent_space(vc));
      // The family says what its tiny autoencoder reads (TAEF2: the FLUX.2 VAE's own latent;
      // TAEF1: the scaled latents of the sampler); the VAE latent already is TAEF2's.
      if (m.kind != ModelLatents::VaeLatent)
        m.value = stages_for(store->config()).tiny_decoder_input(*store, m.value, m.grid, cx);
      image = tiny_decode(tiny, m.value, cx);
      tiny_output_to_signed(image);
      by = "the tiny decoder " + o.tiny.string();
    } else {
      if (m.kind == ModelLatents::VaeLatent)
        image = vae::Vae(*store, cx).decode_latent(m.value);
      else
        image = stages_for(store->config()).decode_latents(*store, m.value, m.grid, cx);
      by = "the VAE of the model";
    }
  }
  save_image(o.output, tensor_to_image(image));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %lldx%lld decoded by %s in %.2f s\n", o.output.string().c_str(),
              (long long)image.dim(2), (long long)image.dim(1), by.c_str(), seconds);
}

// The image cut (evenly, as references are) to sides that are multiples of `multiple`.
Image load_cropped(const fs::path& path, int multiple) {
  Image image = load_image(path);
  const int width = image.width, height = image.height;
  check(width >= multiple && height >= multiple, path.string(), ": ", width, "x", height,
        " is smaller than ", multiple, " pixels a side");
  image = center_crop_to_multiple(image, multiple);
  if (image.width != width || image.height != height)
    std::fprintf(stderr, "note: %s cropped from %dx%d to %dx%d (multiples of %d)\n",
                 path.string().c_str(), width, height, image.width, image.height, multiple);
  return image;
}

// [3, H, W] in [0, 1], as taesd.py takes images.
Tensor unit_pixels(const Image& image) {
  Tensor x = image_to_tensor(image);
  for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = x.data()[i] * 0.5f + 0.5f;
  return x;
}

void run_encode(const VaeOptions& o) {
  check_writable_output(o.output, "-o");
  const auto start = std::chrono::steady_clock::now();
  Compute cx(o.threads);
  Tensor latents;  // without the batch dimension
  std::string by;
  if (!has_model(o.paths)) {
    check(!o.tiny.empty(), "vae encode: give the model (-m) or a tiny encoder (--vae-encoder)");
    const taesd::TinyEncoder tiny(o.tiny);
    latents = tiny.encode(unit_pixels(load_cropped(o.input, 8)), cx);
    by = "the tiny encoder " + o.tiny.string();
  } else {
    auto store = open_model(o.paths);
    store->set_residency(Residency::Paged);
    const VaeConfig& vc = store->config().vae;
    const vae::Vae vae(*store, cx);
    const int multiple = int(vae.pixels_per_token());
    const Image image = load_cropped(o.input, multiple);
    const int64_t rows = image.height / multiple, cols = image.width / multiple;
    if (!o.tiny.empty()) {
      const taesd::TinyEncoder tiny(o.tiny, vc.latent_channels,
                                    "the latents of " + latent_space(vc));
      latents = tiny.encode(unit_pixels(image), cx);
      // TAEF2 gives the FLUX.2 VAE's own latent: patchified and normalized like the VAE's.
      if (vc.latent_batch_norm)
        latents = vae::unpack_tokens(vae.latent_to_tokens(latents), rows, cols);
      by = "the tiny encoder " + o.tiny.string();
    } else {
      latents = stages_for(store->config()).encode_image(*store, image_to_tensor(image), cx);
      by = "the VAE of the model";
    }
  }
  Shape shape = latents.shape();
  shape.insert(shape.begin(), 1);
  latents.reshape(shape);
  write_npy(o.output, latents);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: latents %s encoded by %s in %.2f s\n", o.output.string().c_str(),
              shape_str(latents.shape()).c_str(), by.c_str(), seconds);
}

}  // namespace

static Registration vae_command("vae", 45, [](CLI::App& app) {
  CLI::App* vae = app.add_subcommand(
      "vae",
      "Decode saved latents into an image, or encode an image into latents, with the "
      "model's VAE or a tiny autoencoder (TAEF2, TAEF1)");
  vae->require_subcommand(1);

  auto d = std::make_shared<VaeOptions>();
  CLI::App* decode =
      vae->add_subcommand("decode", "Latents (.npy, the layouts generate --dump writes) -> image");
  add_model_options(*decode, d->paths);
  decode
      ->add_option("--latents", d->input,
                   "latents .npy: FLUX.2 tokens [1, h*w, 128] (final_latents), [1, 128, h, w] "
                   "or the decoder's input [1, 32, H/8, W/8] (vae_input); Z-Image "
                   "[1, 16, H/8, W/8] (final_latents); with only --vae-decoder, the tiny "
                   "network's own [1, C, H/8, W/8]")
      ->required()
      ->check(CLI::ExistingFile);
  decode->add_option("-o,--output", d->output, "output image (.png, .jpg, .webp)")->required();
  decode->add_option("--vae-decoder", d->tiny,
                     "a tiny autoencoder's decoder (taesd.py's layout, .pth or .safetensors: "
                     "taef2_decoder.pth for FLUX.2, taef1_decoder.pth for Z-Image) instead of "
                     "the model's VAE; needs no -m");
  decode
      ->add_option("--width", d->width,
                   "image width, for FLUX.2 tokens of a grid that is not square")
      ->check(CLI::PositiveNumber);
  decode->add_option("--height", d->height, "image height, with --width")
      ->check(CLI::PositiveNumber);
  decode->add_option("--threads", d->threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  decode->callback([d] { run_decode(*d); });

  auto e = std::make_shared<VaeOptions>();
  CLI::App* encode = vae->add_subcommand(
      "encode", "Image -> latents (.npy, in the layout generate --dump writes)");
  add_model_options(*encode, e->paths);
  encode
      ->add_option("image", e->input,
                   "the image (PNG, JPEG, WebP); cut to multiples of 16 "
                   "(8 with only a tiny encoder)")
      ->required()
      ->check(CLI::ExistingFile);
  encode
      ->add_option("-o,--output", e->output,
                   "output .npy: FLUX.2 [1, 128, H/16, W/16] (normalized, as image_latents), "
                   "Z-Image [1, 16, H/8, W/8] (scaled); with only --vae-encoder, the tiny "
                   "network's own [1, C, H/8, W/8]")
      ->required();
  encode->add_option("--vae-encoder", e->tiny,
                     "a tiny autoencoder's encoder (taesd.py's layout, .pth or .safetensors) "
                     "instead of the model's VAE; needs no -m");
  encode->add_option("--threads", e->threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  encode->callback([e] { run_encode(*e); });
});

}  // namespace klein::cli
