// Z-Image from a picture through the engine's front door: `klein generate` with --init-image
// (and --mask) reproduces every stage of the image-to-image and inpainting runs of
// ../shared/testdata/zimage-control (diffusers' ZImageImg2ImgPipeline and
// ZImageInpaintPipeline on a tiny random-weight model), given the official initial noise
// (--noise) and the noise of the VAE's posterior sample (--vae-noise): the preprocessed
// image, the posterior's mean and std, the image latents, the noised start, every step (the
// inpainting blend's target and the latents before and after it), the final latents, the
// decoder's output, the image and the PNG. Bad input is refused by name before any work.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace zimage_image_test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path control_model() { return testing::tiny_dir().parent_path() / "zimage-control" / "model"; }
fs::path case_dir(const std::string& name) {
  return testing::golden_vectors("zimage-control", "e2e") / name;
}

// The generate command of one official run, its settings read from case.json.
std::string command_for(const fs::path& ref, const fs::path& out) {
  const json c = json::parse(read_text_file(ref / "case.json"));
  std::string args = "generate -m " + testing::shell_arg(control_model()) + " -p " +
                     testing::shell_arg(c["prompt"].get<std::string>()) + " -s " +
                     std::to_string(c["steps"].get<int>()) + " -g " +
                     std::to_string(c["guidance_scale"].get<double>()) + " --strength " +
                     std::to_string(c["strength"].get<double>()) + " --init-image " +
                     testing::shell_arg(ref / "init.png");
  if (c.contains("negative_prompt") && c["negative_prompt"].is_string())
    args += " -n " + testing::shell_arg(c["negative_prompt"].get<std::string>());
  if (fs::exists(ref / "mask.png")) args += " --mask " + testing::shell_arg(ref / "mask.png");
  return args + " --noise " + testing::shell_arg(ref / "noise.npy") + " --vae-noise " +
         testing::shell_arg(ref / "vae_encode_noise0.npy") + " --dump " +
         testing::shell_arg(out / "dump") + " -o " + testing::shell_arg(out / "image.png") +
         " --no-cache --threads 2 -q";
}

void expect_close(const fs::path& got, const fs::path& want, double tolerance) {
  ASSERT_TRUE(fs::exists(got)) << got;
  const std::vector<float> g = read_npy(got).to_f32();
  EXPECT_TRUE(testing::matches_npy(g.data(), int64_t(g.size()), want, tolerance)) << got;
}

class ZImageFromAPicture : public ::testing::TestWithParam<const char*> {};

TEST_P(ZImageFromAPicture, MatchesTheOfficialPipelineAtEveryStage) {
  const std::string name = GetParam();
  const fs::path ref = case_dir(name);
  const fs::path out = testing::temp_dir("zimage-picture-" + name);
  std::string log;
  ASSERT_EQ(testing::run_klein(command_for(ref, out), &log), 0) << log;

  const json info = json::parse(read_text_file(ref / "case.json"));
  const bool inpaint = fs::exists(ref / "mask.png");
  const fs::path dump = out / "dump";
  constexpr double kTolerance = 1e-4;
  std::vector<std::string> files = {"prompt_embeds", "init_pixels", "init_latent_mean",
                                    "init_latent_std", "image_latents", "latents_initial"};
  if (info["guidance_scale"].get<double>() > 0) files.push_back("negative_prompt_embeds");
  if (inpaint) files.insert(files.end(), {"mask_pixels", "mask_latent"});
  for (const std::string& f : files) expect_close(dump / (f + ".npy"), ref / (f + ".npy"), kTolerance);

  // The steps that run are the last ones of the schedule, numbered from 0.
  const int run = info["steps_run"].get<int>();
  ASSERT_LT(run, info["steps"].get<int>() + 1);
  for (int i = 0; i < run; ++i) {
    const std::string p = "step" + std::to_string(i) + "_";
    const std::vector<float> t = read_npy(dump / (p + "t_model.npy")).to_f32();
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0], read_npy(ref / (p + "t_model.npy")).to_f32().front()) << p;
    std::vector<std::string> parts = {"latents_in", "velocity", "latents_out"};
    if (inpaint) parts.insert(parts.end(), {"latents_stepped", "init_latents_proper"});
    for (const std::string& part : parts)
      expect_close(dump / (p + part + ".npy"), ref / (p + part + ".npy"), kTolerance);
  }
  EXPECT_FALSE(fs::exists(dump / ("step" + std::to_string(run) + "_velocity.npy")));
  for (const char* f : {"final_latents", "vae_input", "image_decoded", "image"})
    expect_close(dump / (std::string(f) + ".npy"), ref / (std::string(f) + ".npy"), kTolerance);
  testing::expect_png_matches(out / "image.png", ref / "image.png", info["width"].get<int>(),
                              info["height"].get<int>());

  // The record says what took effect: the strength, and the steps of the full schedule.
  std::string parameters;
  for (const auto& [k, v] : read_image_metadata(out / "image.png"))
    if (k == "parameters") parameters = v;
  EXPECT_NE(parameters.find("Steps: " + std::to_string(info["steps"].get<int>())),
            std::string::npos)
      << parameters;
  EXPECT_NE(parameters.find("Denoising strength: "), std::string::npos) << parameters;
}

INSTANTIATE_TEST_SUITE_P(OfficialRuns, ZImageFromAPicture,
                         ::testing::Values("img2img_s060_h64_w96", "img2img_s090_h80_w48",
                                           "inpaint_rect_h64_w80", "inpaint_full_h48_w64"),
                         [](const auto& info) { return std::string(info.param); });

// From a seed, the VAE's sampling noise is the seed's own stream (not the initial noise), the
// run repeats exactly, and the pipeline's default strength (0.6) runs the last int(8 · 0.6)
// steps. Inpainting keeps the unmasked part of the init image.
TEST(ZImageFromAPicture, ASeedDrawsBothNoisesAndRepeats) {
  const fs::path ref = case_dir("inpaint_rect_h64_w80");
  const fs::path dir = testing::temp_dir("zimage-picture-seed");
  auto run = [&](const std::string& name, const std::string& extra) {
    std::string log;
    EXPECT_EQ(testing::run_klein("generate -m " + testing::shell_arg(control_model()) +
                                     " -p x --seed 11 --no-cache -q --init-image " +
                                     testing::shell_arg(ref / "init.png") + extra + " --dump " +
                                     testing::shell_arg(dir / name) + " -o " +
                                     testing::shell_arg(dir / (name + ".png")),
                                 &log),
              0)
        << log;
  };
  run("a", "");
  run("b", "");
  EXPECT_EQ(read_npy(dir / "a" / "image.npy").to_f32(), read_npy(dir / "b" / "image.npy").to_f32());
  EXPECT_NE(read_npy(dir / "a" / "noise.npy").to_f32(),
            read_npy(dir / "a" / "vae_encode_noise0.npy").to_f32());
  // Turbo's 8 steps at the default 0.6: int(8 - 4.8) = 3 skipped, 5 run.
  EXPECT_TRUE(fs::exists(dir / "a" / "step4_latents_out.npy"));
  EXPECT_FALSE(fs::exists(dir / "a" / "step5_latents_out.npy"));

  // Inpainting at strength 1 (its default) from the same seed: the black part of the mask
  // comes back as the init image's latents.
  run("m", " --mask " + testing::shell_arg(ref / "mask.png"));
  EXPECT_TRUE(fs::exists(dir / "m" / "step7_latents_out.npy"));
  const std::vector<float> final_latents = read_npy(dir / "m" / "final_latents.npy").to_f32();
  const std::vector<float> image = read_npy(dir / "m" / "image_latents.npy").to_f32();
  const std::vector<float> mask = read_npy(dir / "m" / "mask_latent.npy").to_f32();
  ASSERT_EQ(final_latents.size(), image.size());
  ASSERT_EQ(final_latents.size() % mask.size(), 0u);
  size_t kept = 0, repainted = 0;
  for (size_t i = 0; i < final_latents.size(); ++i) {
    if (mask[i % mask.size()] == 0) {
      EXPECT_EQ(final_latents[i], image[i]) << i;
      ++kept;
    } else {
      repainted += final_latents[i] != image[i];
    }
  }
  EXPECT_GT(kept, 0u);
  EXPECT_GT(repainted, 0u);
}

// Bad input is refused by name before any network runs, and no image is written.
TEST(ZImageFromAPicture, RefusesBadInputBeforeAnyWork) {
  const fs::path ref = case_dir("img2img_s060_h64_w96");
  const fs::path dir = testing::temp_dir("zimage-picture-refusals");
  const std::string init = " --init-image " + testing::shell_arg(ref / "init.png");
  const std::string noise = " --noise " + testing::shell_arg(ref / "noise.npy");
  const std::string vae_noise = " --vae-noise " + testing::shell_arg(ref / "vae_encode_noise0.npy");
  const std::string other_size =
      " --vae-noise " + testing::shell_arg(case_dir("img2img_s090_h80_w48") / "vae_encode_noise0.npy");
  struct Refusal {
    std::string args, expected;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {"--mask " + testing::shell_arg(case_dir("inpaint_rect_h64_w80") / "mask.png"),
            "--mask needs --init-image"},
           {"--strength 0.5", "--strength needs --init-image"},
           {vae_noise, "--vae-noise needs --init-image"},
           {init + " --strength 1.5", "--strength: expected a number in (0, 1]"},
           {init + " -W 64 -H 64", "keeps the init image's size, 96x64"},
           {init + noise, "--noise with --init-image needs --vae-noise"},
           {init + noise + other_size, "--vae-noise"},
           {init + " -r " + testing::shell_arg(ref / "init.png"), "--reference: not available"}})
    testing::expect_refused_before_work(
        "generate -m " + testing::shell_arg(control_model()) + " -p x -s 2 --no-cache " + r.args,
        r.expected, dir / "out.png");
}

}  // namespace
}  // namespace zimage_image_test
}  // namespace klein
