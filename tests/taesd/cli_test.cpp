// klein vae decode / encode through the CLI binary: the model's VAE on the latents and images
// of the official vectors (klein-tiny, klein-tiny-edit, zimage-tiny), the tiny autoencoders
// alone and on a model's latents, and the refusals (a tiny network of the wrong latent width,
// nothing to decode with).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/npy.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"
#include "models/taesd/taesd.h"
#include "models/vae/vae.h"
#include "support/cli_image.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::max_level_diff;
using testing::shell_arg;

fs::path taef2() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2"; }
fs::path t2i() { return testing::tiny_vectors() / "e2e" / "t2i_h96_w128"; }
fs::path zimage() { return testing::tiny_dir().parent_path() / "zimage-tiny"; }

std::string klein_ok(const std::string& args) {
  std::string log;
  const int rc = testing::run_klein(args, &log);
  EXPECT_EQ(rc, 0) << "klein " << args << "\n" << log;
  return log;
}

// The official pipeline's image ([H, W, 3] in [0, 1], before the 8-bit rounding) in 8 bits.
Image reference_image(const fs::path& npy) {
  const NpyArray a = read_npy(npy);
  const std::vector<float> v = a.to_f32();
  Image img(int(a.shape[1]), int(a.shape[0]));
  for (size_t i = 0; i < v.size(); ++i)
    img.rgb[i] = uint8_t(std::lround(std::clamp(v[i], 0.0f, 1.0f) * 255.0f));
  return img;
}

// FLUX.2: final_latents as tokens (grid from --width/--height), the same as [1, 128, h, w], and
// the decoder's own input vae_input: the official image within one level each.
TEST(VaeCli, DecodesEveryDumpLayoutOfFlux2) {
  const fs::path dir = testing::temp_dir("taesd-cli-decode");
  const std::string m = "-m " + shell_arg(testing::tiny_model());
  klein_ok("vae decode " + m + " --latents " + shell_arg(t2i() / "final_latents.npy") +
           " --width 128 --height 96 -o " + shell_arg(dir / "tokens.png"));
  klein_ok("vae decode " + m + " --latents " + shell_arg(t2i() / "vae_input.npy") + " -o " +
           shell_arg(dir / "vae_input.png"));
  Tensor tokens = read_npy(t2i() / "final_latents.npy").to_tensor();  // [1, 48, 128]
  Tensor chw({1, 128, 6, 8});
  for (int64_t c = 0; c < 128; ++c)
    for (int64_t p = 0; p < 48; ++p) chw.data()[c * 48 + p] = tokens.data()[p * 128 + c];
  write_npy(dir / "packed.npy", chw);
  klein_ok("vae decode " + m + " --latents " + shell_arg(dir / "packed.npy") + " -o " +
           shell_arg(dir / "packed.png"));
  const Image ref = reference_image(t2i() / "image.npy");
  EXPECT_LE(max_level_diff(load_image(dir / "tokens.png"), ref), 1);
  EXPECT_LE(max_level_diff(load_image(dir / "vae_input.png"), ref), 1);
  EXPECT_EQ(max_level_diff(load_image(dir / "packed.png"), load_image(dir / "tokens.png")), 0);
  // 48 tokens are no square: the size must be given.
  std::string log;
  EXPECT_NE(testing::run_klein("vae decode " + m + " --latents " +
                                   shell_arg(t2i() / "final_latents.npy") + " -o " +
                                   shell_arg(dir / "x.png"),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("not a square grid; give the image's --width and --height"));
}

// Z-Image: the sampler's final latents through the scaled FLUX.1 VAE: the official image.
TEST(VaeCli, DecodesZImageLatents) {
  const fs::path dir = testing::temp_dir("taesd-cli-zimage");
  const fs::path v = zimage() / "vectors" / "e2e" / "turbo_h64_w96";
  klein_ok("vae decode -m " + shell_arg(zimage() / "model") + " --latents " +
           shell_arg(v / "final_latents.npy") + " -o " + shell_arg(dir / "z.png"));
  EXPECT_LE(max_level_diff(load_image(dir / "z.png"), reference_image(v / "image.npy")), 1);
}

// FLUX.2 encode: the init image of an inpainting case gives the pipeline's image_latents
// (packed [1, N, 128] there, [1, 128, h, w] here).
TEST(VaeCli, EncodesAsThePipelineDoes) {
  const fs::path dir = testing::temp_dir("taesd-cli-encode");
  const fs::path v = testing::tiny_dir().parent_path() / "klein-tiny-edit" / "vectors" / "inpaint" /
                     "inpaint_s06_h80_w64";
  klein_ok("vae encode -m " + shell_arg(testing::tiny_model()) + " " + shell_arg(v / "init.png") +
           " -o " + shell_arg(dir / "latents.npy"));
  const NpyArray got = read_npy(dir / "latents.npy");
  ASSERT_EQ(got.shape, (Shape{1, 128, 5, 4}));
  const std::vector<float> g = got.to_f32();
  const std::vector<float> ref = read_npy(v / "image_latents.npy").to_f32();  // [1, 20, 128]
  std::vector<float> packed(g.size());
  for (int64_t c = 0; c < 128; ++c)
    for (int64_t p = 0; p < 20; ++p) packed[size_t(p * 128 + c)] = g[size_t(c * 20 + p)];
  EXPECT_LE(testing::scaled_diff(packed.data(), ref.data(), int64_t(ref.size())), 1e-4);
}

// Z-Image encode: the FLUX.1 VAE's mean scaled as its pipelines scale an encoded image,
// (z - shift_factor) * scaling_factor, the inverse of what decoding undoes.
TEST(VaeCli, EncodesZImageLatentsScaled) {
  const fs::path dir = testing::temp_dir("taesd-cli-zimage-encode");
  const fs::path image = zimage() / "vectors" / "e2e" / "turbo_h64_w96" / "image.png";
  klein_ok("vae encode -m " + shell_arg(zimage() / "model") + " " + shell_arg(image) + " -o " +
           shell_arg(dir / "z.npy"));
  const NpyArray got = read_npy(dir / "z.npy");
  ASSERT_EQ(got.shape, (Shape{1, 16, 8, 12}));
  auto store = open_model(zimage() / "model");
  const VaeConfig& vc = store->config().vae;
  Compute cx(2);
  Tensor mean = vae::Vae(*store, cx).encode_mean(image_to_tensor(load_image(image)));
  for (int64_t i = 0; i < mean.numel(); ++i)
    mean.data()[i] = (mean.data()[i] - float(vc.shift_factor)) * float(vc.scaling_factor);
  EXPECT_NEAR(vc.scaling_factor, 0.3611, 1e-6);
  EXPECT_EQ(got.to_f32(), std::vector<float>(mean.data(), mean.data() + mean.numel()));
}

// The tiny autoencoder alone (its own latents) is the in-process network, pixel for pixel and
// value for value; with the model, FLUX.2's tokens become the VAE latent TAEF2 reads.
TEST(VaeCli, TinyAutoencoderAloneAndOnAModelsLatents) {
  const fs::path dir = testing::temp_dir("taesd-cli-tiny");
  const fs::path decoder = taef2() / "taef2_decoder.pth", encoder = taef2() / "taef2_encoder.pth";
  klein_ok("vae decode --vae-decoder " + shell_arg(decoder) + " --latents " +
           shell_arg(t2i() / "vae_input.npy") + " -o " + shell_arg(dir / "alone.png"));
  klein_ok("vae decode -m " + shell_arg(testing::tiny_model()) + " --vae-decoder " +
           shell_arg(decoder) + " --latents " + shell_arg(t2i() / "final_latents.npy") +
           " --width 128 --height 96 -o " + shell_arg(dir / "model.png"));
  Compute cx(2);
  Tensor z = read_npy(t2i() / "vae_input.npy").to_tensor();
  z.reshape({32, 12, 16});
  Tensor image = taesd::TinyDecoder(decoder).decode(z, cx);
  for (int64_t i = 0; i < image.numel(); ++i) image.data()[i] = image.data()[i] * 2.0f - 1.0f;
  const Image expected = tensor_to_image(image);
  EXPECT_EQ(max_level_diff(load_image(dir / "alone.png"), expected), 0);
  EXPECT_LE(max_level_diff(load_image(dir / "model.png"), expected), 1);

  klein_ok("vae encode --vae-encoder " + shell_arg(encoder) + " " + shell_arg(t2i() / "image.png") +
           " -o " + shell_arg(dir / "tiny.npy"));
  Tensor pixels = image_to_tensor(load_image(t2i() / "image.png"));
  for (int64_t i = 0; i < pixels.numel(); ++i) pixels.data()[i] = pixels.data()[i] * 0.5f + 0.5f;
  const Tensor latents = taesd::TinyEncoder(encoder).encode(pixels, cx);
  const NpyArray got = read_npy(dir / "tiny.npy");
  ASSERT_EQ(got.shape, (Shape{1, 32, 12, 16}));
  EXPECT_EQ(got.to_f32(), std::vector<float>(latents.data(), latents.data() + latents.numel()));
}

TEST(VaeCli, RefusesATinyAutoencoderOfTheWrongWidthAndNothingToDecodeWith) {
  const fs::path dir = testing::temp_dir("taesd-cli-refuse");
  std::string log;
  const fs::path v = zimage() / "vectors" / "e2e" / "turbo_h64_w96";
  EXPECT_EQ(
      testing::run_klein("vae decode -m " + shell_arg(zimage() / "model") + " --vae-decoder " +
                             shell_arg(taef2() / "taef2_decoder.pth") + " --latents " +
                             shell_arg(v / "final_latents.npy") + " -o " + shell_arg(dir / "x.png"),
                         &log),
      1);
  EXPECT_THAT(log, HasSubstr((taef2() / "taef2_decoder.pth").string() +
                             ": a tiny autoencoder of 32 latent channels: TAEF2"));
  EXPECT_THAT(log, HasSubstr("need one of 16 latent channels: TAEF1"));
  EXPECT_EQ(
      testing::run_klein("vae encode -m " + shell_arg(testing::tiny_model()) + " --vae-encoder " +
                             shell_arg(taef2() / "taef1_random_encoder.pth") + " " +
                             shell_arg(t2i() / "image.png") + " -o " + shell_arg(dir / "x.npy"),
                         &log),
      1);
  EXPECT_THAT(log, HasSubstr("taef1_random_encoder.pth: a tiny autoencoder of 16 latent channels"));
  EXPECT_EQ(testing::run_klein("vae decode --latents " + shell_arg(t2i() / "vae_input.npy") +
                                   " -o " + shell_arg(dir / "x.png"),
                               &log),
            1);
  EXPECT_THAT(log, HasSubstr("give the model (-m) or a tiny decoder (--vae-decoder)"));
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  EXPECT_FALSE(fs::exists(dir / "x.npy"));
}

// The output is checked before the networks are read: an image name save_image cannot write,
// and a directory that does not exist, each named with -o; nothing written.
TEST(VaeCli, RefusesAnOutputItCannotWriteBeforeAnyWork) {
  const fs::path dir = testing::temp_dir("taesd-cli-output");
  const std::string decode = "vae decode --vae-decoder " + shell_arg(taef2() / "taef2_decoder.pth") +
                             " --latents " + shell_arg(t2i() / "vae_input.npy") + " -o ";
  std::string log;
  EXPECT_EQ(testing::run_klein(decode + shell_arg(dir / "x.bmp"), &log), 1);
  EXPECT_THAT(log, HasSubstr("-o " + (dir / "x.bmp").string() +
                             ": the output must end in .png, .jpg, .jpeg or .webp"));
  EXPECT_EQ(testing::run_klein(decode + shell_arg(dir / "no" / "x.png"), &log), 1);
  EXPECT_THAT(log, HasSubstr("-o"));
  EXPECT_THAT(log, HasSubstr((dir / "no").string()));
  EXPECT_EQ(testing::run_klein("vae encode --vae-encoder " +
                                   shell_arg(taef2() / "taef2_encoder.pth") + " " +
                                   shell_arg(t2i() / "image.png") + " -o " +
                                   shell_arg(dir / "no" / "x.npy"),
                               &log),
            1);
  EXPECT_THAT(log, HasSubstr((dir / "no").string()));
  EXPECT_FALSE(fs::exists(dir / "x.bmp"));
  EXPECT_FALSE(fs::exists(dir / "no"));
}

}  // namespace
}  // namespace klein
