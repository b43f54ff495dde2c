// The tiny autoencoders in a generation (pipeline/tiny_decoder.h), through `klein generate`:
// --decoder tiny decodes the final latents with TAEF2 (FLUX.2) or a TAEF1-shaped network
// (Z-Image) exactly as the tiny network alone decodes the official pipelines' latents (the
// FLUX.2 VAE's input vae_input.npy; Z-Image's final latents); with --tiny-vae the step
// previews are the tiny decoder's pictures, the last one the estimate the final latents are,
// averaged down to --preview-size; the full decoder's image does not change; and a tiny
// network of the wrong latent width, or --decoder tiny without one, is refused before any work.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "formats/image/image.h"
#include "support/cli_image.h"
#include "support/testing.h"

namespace klein {
namespace tiny_decoder_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::max_level_diff;
using testing::shell_arg;

fs::path taesd_data() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2"; }
fs::path taef2() { return taesd_data() / "taef2_decoder.pth"; }
fs::path taef1() { return taesd_data() / "taef1_random_decoder.safetensors"; }

void run_ok(const std::string& args) {
  std::string log;
  ASSERT_EQ(testing::run_klein(args, &log), 0) << "klein " << args << "\n" << log;
}

std::string metadata(const fs::path& image, const std::string& key) {
  for (const auto& [k, v] : read_image_metadata(image))
    if (k == key) return v;
  return "";
}

// klein-tiny's t2i_h96_w128 with the official noise: the tiny decode of the generation is the
// tiny decode of the official VAE input (the generation's latents match it within 1e-4), and
// the last step's preview is the same picture (the last Euler step lands on its estimate).
TEST(TinyDecoderGenerate, Flux2DecodesWhatTaef2MakesOfTheOfficialLatents) {
  const fs::path ref = testing::tiny_vectors() / "e2e" / "t2i_h96_w128";
  const fs::path out = testing::temp_dir("tiny-decoder-flux2");
  run_ok("generate -m " + shell_arg(testing::tiny_model()) +
         " -p \"a red cube on a wooden table, studio light\" -W 128 -H 96 --noise " +
         shell_arg(ref / "noise.npy") + " --tiny-vae " + shell_arg(taef2()) +
         " --decoder tiny --preview " + shell_arg(out / "preview.png") + " --dump " +
         shell_arg(out / "dump") + " -o " + shell_arg(out / "image.png") +
         " --no-cache --threads 2 -q");
  const std::vector<float> input = read_npy(out / "dump" / "tiny_decoder_input.npy").to_f32();
  EXPECT_TRUE(testing::matches_npy(input.data(), int64_t(input.size()), ref / "vae_input.npy",
                                   1e-4));
  EXPECT_FALSE(fs::exists(out / "dump" / "vae_input.npy")) << "the full decoder ran";
  run_ok("vae decode --vae-decoder " + shell_arg(taef2()) + " --latents " +
         shell_arg(ref / "vae_input.npy") + " -o " + shell_arg(out / "alone.png"));
  const Image image = load_image(out / "image.png");
  EXPECT_EQ(image.width, 128);
  EXPECT_EQ(image.height, 96);
  EXPECT_LE(max_level_diff(image, load_image(out / "alone.png")), 1);
  EXPECT_LE(max_level_diff(load_image(out / "preview.png"), image), 1);

  EXPECT_NE(metadata(out / "image.png", "parameters").find("Decoder: tiny (taef2_decoder.pth)"),
            std::string::npos);
  const json record = json::parse(metadata(out / "image.png", "klein"));
  EXPECT_EQ(record["decoder"]["name"], "tiny") << record.dump();
  EXPECT_EQ(record["decoder"]["file"], "taef2_decoder.pth") << record.dump();
}

// zimage-tiny's turbo_h64_w96: a TAEF1-shaped network reads the sampler's latents as they are.
TEST(TinyDecoderGenerate, ZImageDecodesWhatTaef1MakesOfTheOfficialLatents) {
  const fs::path ref = testing::golden_vectors("zimage-tiny", "e2e") / "turbo_h64_w96";
  const fs::path out = testing::temp_dir("tiny-decoder-zimage");
  const json c = json::parse(read_text_file(ref / "case.json"));
  run_ok("generate -m " + shell_arg(testing::zimage_model()) + " -p " +
         shell_arg(c["prompt"].get<std::string>()) + " -s " +
         std::to_string(c["steps"].get<int>()) + " -W " + std::to_string(c["width"].get<int>()) +
         " -H " + std::to_string(c["height"].get<int>()) + " -g " +
         std::to_string(c["guidance_scale"].get<double>()) + " --noise " +
         shell_arg(ref / "noise.npy") + " --tiny-vae " + shell_arg(taef1()) +
         " --decoder tiny --preview " + shell_arg(out / "preview.png") + " -o " +
         shell_arg(out / "image.png") + " --no-cache --threads 2 -q");
  run_ok("vae decode --vae-decoder " + shell_arg(taef1()) + " --latents " +
         shell_arg(ref / "final_latents.npy") + " -o " + shell_arg(out / "alone.png"));
  const Image image = load_image(out / "image.png");
  EXPECT_EQ(image.width, c["width"].get<int>());
  EXPECT_EQ(image.height, c["height"].get<int>());
  EXPECT_LE(max_level_diff(image, load_image(out / "alone.png")), 1);
  EXPECT_LE(max_level_diff(load_image(out / "preview.png"), image), 1);
}

// --tiny-vae alone changes the previews, not the image; --preview-size shrinks the preview by
// whole latent cells (64x96 pixels: 8x12 cells; 32 pixels: 4 cells a side at most, so 3x3 cells
// each, 2x4 of them, 16x32 pixels).
TEST(TinyDecoderGenerate, PreviewsOnlyWithoutDecoderTinyAndToTheirSize) {
  const fs::path out = testing::temp_dir("tiny-decoder-previews");
  const std::string base = "generate -m " + shell_arg(testing::tiny_model()) +
                           " -p \"a tiny test\" -W 96 -H 64 --seed 3 --no-cache -q";
  run_ok(base + " -o " + shell_arg(out / "full.png") + " --preview " +
         shell_arg(out / "fit.png"));
  run_ok(base + " -o " + shell_arg(out / "with_tiny.png") + " --tiny-vae " + shell_arg(taef2()) +
         " --preview " + shell_arg(out / "tiny.png"));
  run_ok(base + " -o " + shell_arg(out / "small.png") + " --tiny-vae " + shell_arg(taef2()) +
         " --preview-size 32 --preview " + shell_arg(out / "small_preview.png"));
  EXPECT_EQ(load_image(out / "with_tiny.png").rgb, load_image(out / "full.png").rgb);
  EXPECT_EQ(metadata(out / "with_tiny.png", "parameters").find("Decoder"), std::string::npos);
  const Image fit = load_image(out / "fit.png"), tiny = load_image(out / "tiny.png");
  EXPECT_EQ(fit.width, 12);  // the colour fit: one pixel per 8x8
  EXPECT_EQ(fit.height, 8);
  EXPECT_EQ(tiny.width, 96);
  EXPECT_EQ(tiny.height, 64);
  const Image small = load_image(out / "small_preview.png");
  EXPECT_EQ(small.width, 32);
  EXPECT_EQ(small.height, 16);
}

TEST(TinyDecoderGenerate, RefusedBeforeAnyWork) {
  const fs::path out = testing::temp_dir("tiny-decoder-refusals") / "image.png";
  const std::string klein = "generate -m " + shell_arg(testing::tiny_model()) + " -p x -W 64 -H 64 --no-cache";
  const std::string zimage = "generate -m " + shell_arg(testing::zimage_model()) + " -p x -W 64 -H 64 --no-cache";
  // The wrong latent width, each way, naming the file and both widths.
  testing::expect_refused_before_work(klein + " --tiny-vae " + shell_arg(taef1()),
                                      taef1().string() + ": a tiny autoencoder of 16 latent channels", out);
  testing::expect_refused_before_work(klein + " --tiny-vae " + shell_arg(taef1()),
                                      "need one of 32 latent channels", out);
  testing::expect_refused_before_work(zimage + " --decoder tiny --tiny-vae " + shell_arg(taef2()),
                                      "need one of 16 latent channels", out);
  testing::expect_refused_before_work(klein + " --decoder tiny", "--decoder tiny: no tiny decoder", out);
  testing::expect_refused_before_work(klein + " --decoder small", "--decoder small: expected full", out);
  testing::expect_refused_before_work(klein + " --tiny-vae " + shell_arg(out.parent_path() / "none.pth"),
                                      "none.pth: no such file", out);
  testing::expect_refused_before_work(klein + " --tiny-vae " + shell_arg(taef2()) + " --preview-size 4",
                                      "--preview-size", out);
  // A .pth that is not a tiny decoder (the encoder half).
  testing::expect_refused_before_work(klein + " --tiny-vae " + shell_arg(taesd_data() / "taef2_encoder.pth"),
                                      "taef2_encoder.pth", out);
}

// `klein convert --tiny-vae DIR` stores the decoder beside the model, exactly (float32 under
// any -t): inspect shows it; a generation without --tiny-vae takes it for its previews and for
// --decoder tiny, with the pixels the file itself gives; a container source carries it over;
// a decoder of the wrong latent width or a directory without one is refused before anything
// is written.
TEST(TinyDecoderGenerate, AContainerHoldsTheTinyDecoder) {
  const fs::path out = testing::temp_dir("tiny-decoder-container");
  std::string log;
  auto convert = [&](const fs::path& source, const std::string& args, const fs::path& to) {
    return testing::run_klein("convert -m " + shell_arg(source) + args + " -q -o " + shell_arg(to),
                              &log);
  };
  const fs::path held = out / "held.klein";
  ASSERT_EQ(convert(testing::tiny_model(), " -t q8 --tiny-vae " + shell_arg(taesd_data()), held), 0)
      << log;
  ASSERT_EQ(testing::run_klein("inspect " + shell_arg(held), &log), 0) << log;
  EXPECT_NE(log.find("tiny decoder: yes (taef2_decoder.pth: 32 latent channels: TAEF2"),
            std::string::npos)
      << log;
  ASSERT_EQ(testing::run_klein("inspect --json " + shell_arg(held), &log), 0) << log;
  const json described = json::parse(log);
  int tiny_tensors = 0;
  for (const json& t : described["tensors"])
    if (t["name"].get<std::string>().starts_with("tiny_vae.decoder.")) {
      ++tiny_tensors;
      EXPECT_EQ(t["type"], "f32") << t.dump();
    }
  EXPECT_GT(tiny_tensors, 20);

  const std::string base = "generate -m " + shell_arg(held) +
                           " -p \"a tiny test\" -W 96 -H 64 -s 2 --seed 3 --no-cache -q";
  run_ok(base + " --decoder tiny -o " + shell_arg(out / "stored.png") + " --preview " +
         shell_arg(out / "stored_preview.png"));
  run_ok(base + " --decoder tiny --tiny-vae " + shell_arg(taef2()) + " -o " +
         shell_arg(out / "file.png"));
  run_ok(base + " -o " + shell_arg(out / "full.png") + " --preview " +
         shell_arg(out / "preview.png"));
  EXPECT_EQ(load_image(out / "stored.png").rgb, load_image(out / "file.png").rgb);
  EXPECT_NE(load_image(out / "stored.png").rgb, load_image(out / "full.png").rgb);
  EXPECT_NE(metadata(out / "stored.png", "parameters").find("Decoder: tiny (taef2_decoder.pth)"),
            std::string::npos);
  // Its previews at the image's size: the tiny decoder's picture, not the colour fit's 12x8.
  const Image preview = load_image(out / "preview.png");
  EXPECT_EQ(preview.width, 96);
  EXPECT_EQ(preview.height, 64);

  ASSERT_EQ(convert(held, " -t q4", out / "again.klein"), 0) << log;
  ASSERT_EQ(testing::run_klein("inspect " + shell_arg(out / "again.klein"), &log), 0) << log;
  EXPECT_NE(log.find("tiny decoder: yes (taef2_decoder.pth"), std::string::npos) << log;

  EXPECT_NE(convert(testing::zimage_model(), " -t q8 --tiny-vae " + shell_arg(taef2()),
                    out / "zimage.klein"),
            0);
  EXPECT_NE(log.find("need one of 16 latent channels"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "zimage.klein"));
  EXPECT_NE(convert(testing::tiny_model(), " -t q8 --tiny-vae " + shell_arg(out), out / "none.klein"),
            0);
  EXPECT_NE(log.find("no tiny decoder in this directory"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "none.klein"));
}

}  // namespace tiny_decoder_test
}  // namespace klein
