// Image-to-image: `klein generate --init-image --strength` on the tiny model with the official
// noise reproduces every stage diffusers' Flux2KleinImg2ImgPipeline recorded
// (../shared/testdata/klein-tiny-img2img) and its PNG.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/npy.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path img2img_vectors() {
  return testing::tiny_dir().parent_path() / "klein-tiny-img2img" / "vectors" / "img2img";
}

struct Img2ImgCase {
  const char* name;
  const char* prompt;
  const char* strength;
  int steps_run;
  int width, height;  // of the output: the init image's, floored to multiples of 16
};

class Img2Img : public ::testing::TestWithParam<Img2ImgCase> {};

TEST_P(Img2Img, MatchesTheOfficialPipelineAtEveryStage) {
  const Img2ImgCase& c = GetParam();
  const fs::path ref_dir = img2img_vectors() / c.name;
  const fs::path out = testing::temp_dir(std::string("img2img-") + c.name);
  // No -W/-H: the size comes from the init image.
  const std::string args = "generate -m " + testing::tiny_model().string() + " -p \"" +
                           c.prompt + "\" -s 4 --strength " + c.strength + " --init-image " +
                           (ref_dir / "init.png").string() + " --noise " +
                           (ref_dir / "noise.npy").string() + " --dump " +
                           (out / "dump").string() + " -o " + (out / "image.png").string() +
                           " --no-cache --threads 2 -q";
  std::string log;
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;

  std::vector<std::string> files = {"image_latents", "initial_latents", "prompt_embeds",
                                    "final_latents", "image"};
  for (int i = 0; i < c.steps_run; ++i)
    for (const char* part : {"timestep", "latents_in", "velocity", "latents_out"})
      files.push_back("step" + std::to_string(i) + "_" + part);
  for (const auto& f : files) {
    const std::vector<float> g = read_npy(out / "dump" / (f + ".npy")).to_f32();
    EXPECT_TRUE(testing::matches_npy(g.data(), int64_t(g.size()), ref_dir / (f + ".npy"), 1e-4))
        << f;
  }
  // No step beyond the ones the strength keeps.
  EXPECT_FALSE(fs::exists(out / "dump" / ("step" + std::to_string(c.steps_run) + "_velocity.npy")));
  EXPECT_EQ(read_npy(out / "dump" / "img_ids.npy").to_i64(),
            read_npy(ref_dir / "img_ids.npy").to_i64());

  const Image got = load_image(out / "image.png");
  const Image want = load_image(ref_dir / "image.png");
  ASSERT_EQ(got.width, c.width);
  ASSERT_EQ(got.height, c.height);
  ASSERT_EQ(want.width, c.width);
  ASSERT_EQ(want.height, c.height);
  int worst = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i)
    worst = std::max(worst, std::abs(got.rgb[i] - want.rgb[i]));
  EXPECT_LE(worst, 1);

  bool has_strength = false;
  for (const auto& [k, v] : read_image_metadata(out / "image.png"))
    if (k == "parameters")
      has_strength = v.find(std::string("Denoising strength: ") + c.strength) != std::string::npos;
  EXPECT_TRUE(has_strength);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModel, Img2Img,
    ::testing::Values(Img2ImgCase{"img2img_s06_h64_w96", "the same street in winter", "0.6", 2,
                                  96, 64},
                      Img2ImgCase{"img2img_s1_h80_w64", "an oil painting", "1", 4, 64, 80},
                      Img2ImgCase{"img2img_s03_crop_h80_w96", "brighter colors", "0.3", 1, 96,
                                  80}),
    [](const ::testing::TestParamInfo<Img2ImgCase>& info) { return std::string(info.param.name); });

TEST(Img2ImgErrors, StrengthOutOfRangeOrWithoutAnInitImage) {
  const fs::path init = img2img_vectors() / "img2img_s06_h64_w96" / "init.png";
  const std::string base = "generate -m " + testing::tiny_model().string() +
                           " -p x -o " + (testing::temp_dir("img2img-errors") / "x.png").string();
  std::string log;
  EXPECT_NE(testing::run_klein(base + " --strength 0.5", &log), 0);
  EXPECT_NE(log.find("--strength needs --init-image"), std::string::npos) << log;
  for (const char* bad : {"0", "1.5", "-0.2", "nan"}) {
    EXPECT_NE(testing::run_klein(base + " --init-image " + init.string() + " --strength " + bad,
                                 &log), 0) << bad;
    EXPECT_NE(log.find("--strength"), std::string::npos) << log;
  }
  // 4 steps at 0.2: int(0.8) = 0 steps would run.
  EXPECT_NE(testing::run_klein(base + " -s 4 --init-image " + init.string() + " --strength 0.2",
                               &log), 0);
  EXPECT_NE(log.find("runs no step"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(testing::temp_dir("img2img-errors") / "x.png"));
}

}  // namespace
}  // namespace klein
