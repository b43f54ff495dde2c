// Editing from an init image (and with the reference K/V cache, at the end): `klein generate --init-image [--mask] --strength` on the tiny
// model with the official noise reproduces every stage that diffusers'
// Flux2KleinImg2ImgPipeline (../shared/testdata/klein-tiny-img2img) and
// Flux2KleinInpaintPipeline (../shared/testdata/klein-tiny-edit) recorded, and their PNGs.
#include <gtest/gtest.h>

#include <filesystem>

#include "e2e/golden_dump.h"
#include "core/files.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

struct EditCase {
  bool inpaint;  // with mask.png (klein-tiny-edit), else image-to-image (klein-tiny-img2img)
  const char* name;
  const char* prompt;
  const char* strength;  // as given on the command line and shown in the metadata
  int steps_run;
  int width, height;  // the output: the init image's size floored to multiples of 16
  bool reference;     // inpainting with ref.png as a reference
};

fs::path case_dir(const EditCase& c) {
  return c.inpaint ? testing::golden_vectors("klein-tiny-edit", "inpaint") / c.name
                   : testing::golden_vectors("klein-tiny-img2img", "img2img") / c.name;
}

class Editing : public ::testing::TestWithParam<EditCase> {};

TEST_P(Editing, MatchesTheOfficialPipelineAtEveryStage) {
  const EditCase& c = GetParam();
  const fs::path ref_dir = case_dir(c);
  const fs::path out = testing::temp_dir(std::string("edit-") + c.name);
  // No -W/-H: the size comes from the init image.
  std::string args = "generate -m " + testing::tiny_model().string() + " -p \"" + c.prompt +
                     "\" -s 4 --strength " + c.strength + " --init-image " +
                     (ref_dir / "init.png").string() + " --noise " +
                     (ref_dir / "noise.npy").string() + " --dump " + (out / "dump").string() +
                     " -o " + (out / "image.png").string() + " --no-cache --threads 2 -q";
  if (c.inpaint) args += " --mask " + (ref_dir / "mask.png").string();
  if (c.reference) args += " -r " + (ref_dir / "ref.png").string();
  std::string log;
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;

  std::vector<std::string> files = {"image_latents", "initial_latents", "prompt_embeds",
                                    "final_latents", "image"};
  if (c.inpaint) files.insert(files.end(), {"mask_latents", "condition_tokens"});
  testing::expect_dump_matches(out / "dump", ref_dir, files, c.steps_run);
  testing::expect_png_matches(out / "image.png", ref_dir / "image.png", c.width, c.height);

  bool has_strength = false;
  for (const auto& [k, v] : read_image_metadata(out / "image.png"))
    if (k == "parameters")
      has_strength = v.find(std::string("Denoising strength: ") + c.strength) != std::string::npos;
  EXPECT_TRUE(has_strength);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModel, Editing,
    ::testing::Values(
        EditCase{false, "img2img_s06_h64_w96", "the same street in winter", "0.6", 2, 96, 64},
        EditCase{false, "img2img_s1_h80_w64", "an oil painting", "1", 4, 64, 80},
        EditCase{false, "img2img_s03_crop_h80_w96", "brighter colors", "0.3", 1, 96, 80},
        EditCase{true, "inpaint_s1_h64_w96", "a small red boat on a calm lake", "1", 4, 96, 64},
        EditCase{true, "inpaint_s06_h80_w64", "a wooden chair in an empty room", "0.6", 3, 64,
                 80},
        EditCase{true, "inpaint_fullmask_s05_h64_w64", "the same scene at night", "0.5", 2, 64,
                 64},
        EditCase{true, "inpaint_ref_s08_h64_w80",
                 "put the object from the second image on the table", "0.8", 4, 80, 64, true}),
    [](const ::testing::TestParamInfo<EditCase>& info) { return std::string(info.param.name); });

// The tiny model declared as a K/V checkpoint: the official pipeline's class name in
// model_index.json, the components linked from the tiny model.
fs::path kv_model() {
  return testing::tiny_model_declared_as("kv-model", "\"Flux2KleinPipeline\"",
                                         "\"Flux2KleinKVPipeline\"");
}

struct KvCase {
  const char* name;
  const char* prompt;
  int width, height, references;
};

class ReferenceKvCache : public ::testing::TestWithParam<KvCase> {};

// Flux2KleinKVPipeline (../shared/testdata/klein-tiny-kv): references in the first step only,
// their keys and values cached; every step and the image as the official pipeline made them.
TEST_P(ReferenceKvCache, MatchesTheOfficialPipelineAtEveryStep) {
  const KvCase& c = GetParam();
  const fs::path ref_dir = testing::golden_vectors("klein-tiny-kv", "kv") / c.name;
  const fs::path out = testing::temp_dir(std::string("kv-") + c.name);
  const fs::path model = kv_model();
  std::string args = "generate -m " + model.string() + " -p \"" + c.prompt + "\" -s 4 -W " +
                     std::to_string(c.width) + " -H " + std::to_string(c.height) + " --noise " +
                     (ref_dir / "noise.npy").string() + " --dump " + (out / "dump").string() +
                     " -o " + (out / "image.png").string() + " --no-cache --threads 2 -q";
  for (int i = 0; i < c.references; ++i)
    args += " -r " + (ref_dir / ("ref" + std::to_string(i) + ".png")).string();
  std::string log;
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;
  testing::expect_dump_matches(out / "dump", ref_dir,
                               {"prompt_embeds", "ref_tokens", "step0_img_ids", "img_ids",
                                "final_latents", "image"},
                               4);
  testing::expect_png_matches(out / "image.png", ref_dir / "image.png", c.width, c.height);

  // The same references through an ordinary checkpoint give another image: the cache is a
  // property of the checkpoint, not applied to the others.
  const fs::path plain = out / "plain.png";
  std::string plain_args = args;
  plain_args.replace(plain_args.find(model.string()), model.string().size(),
                     testing::tiny_model().string());
  plain_args.replace(plain_args.find((out / "image.png").string()),
                     (out / "image.png").string().size(), plain.string());
  plain_args.replace(plain_args.find(" --dump " + (out / "dump").string()),
                     (" --dump " + (out / "dump").string()).size(), "");
  ASSERT_EQ(testing::run_klein(plain_args, &log), 0) << log;
  EXPECT_NE(read_text_file(plain), read_text_file(out / "image.png"));
}

// Single files carry no model_index.json: --variant 9b-kv says what the checkpoint is, and
// the result is the K/V pipeline's; a variant that contradicts a declared one is refused.
TEST(ReferenceKvCacheVariant, SingleFilesWithVariantRunTheKvPipeline) {
  const fs::path ref_dir = testing::golden_vectors("klein-tiny-kv", "kv") / "kv_1ref_h64_w64";
  const fs::path out = testing::temp_dir("kv-variant");
  const fs::path m = testing::tiny_model();
  const std::string files = " --diffusion-model " +
                            (m / "transformer" / "diffusion_pytorch_model.safetensors").string() +
                            " --text-encoder " + (m / "text_encoder" / "model.safetensors.index.json").string() +
                            " --vae " + (m / "vae" / "diffusion_pytorch_model.safetensors").string() +
                            " --tokenizer " + (m / "tokenizer").string();
  const std::string args = " -p \"turn the object into gold\" -s 4 -W 64 -H 64 -r " +
                           (ref_dir / "ref0.png").string() + " --noise " +
                           (ref_dir / "noise.npy").string() + " --no-cache --threads 2 -q -o ";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate" + files + " --variant 9b-kv" + args +
                                   (out / "image.png").string(), &log), 0) << log;
  testing::expect_png_matches(out / "image.png", ref_dir / "image.png", 64, 64);

  EXPECT_NE(testing::run_klein("generate -m " + m.string() + " --variant 9b-kv" + args +
                                   (out / "x.png").string(), &log), 0);
  EXPECT_NE(log.find("declares a distilled model"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("generate" + files + " --variant 7b" + args +
                                   (out / "x.png").string(), &log), 0);
  EXPECT_NE(log.find("--variant"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "x.png"));

  // Without --variant nothing says which it is: refused before any work, naming the option.
  EXPECT_NE(testing::run_klein("generate" + files + args + (out / "x.png").string(), &log), 0);
  EXPECT_NE(log.find("give --variant 4b, 4b-base, 9b, 9b-base, 9b-kv"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "x.png"));
  // BFL's file names say it, as diffusers' conversion script reads them.
  const fs::path named = out / "flux-2-klein-base-tiny.safetensors";
  fs::create_symlink(m / "transformer" / "diffusion_pytorch_model.safetensors", named);
  ASSERT_EQ(testing::run_klein("inspect --json --diffusion-model " + named.string() +
                                   files.substr(files.find(" --text-encoder")), &log), 0) << log;
  EXPECT_NE(log.find("\"is_distilled\": false"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(
    TinyModel, ReferenceKvCache,
    ::testing::Values(KvCase{"kv_1ref_h64_w64", "turn the object into gold", 64, 64, 1},
                      KvCase{"kv_2ref_h64_w96", "combine both pictures into one scene", 96, 64,
                             2}),
    [](const ::testing::TestParamInfo<KvCase>& info) { return std::string(info.param.name); });

TEST(EditingErrors, RefusedBeforeAnyWork) {
  const fs::path img2img = testing::golden_vectors("klein-tiny-img2img", "img2img");
  const fs::path init = img2img / "img2img_s06_h64_w96" / "init.png";
  const fs::path mask = testing::golden_vectors("klein-tiny-edit", "inpaint") /
                        "inpaint_s1_h64_w96" / "mask.png";
  const fs::path target = testing::temp_dir("edit-errors") / "x.png";
  const std::string base = "generate -m " + testing::tiny_model().string() + " -p x -o " +
                           target.string();
  auto refused = [&](const std::string& options, const std::string& message) {
    std::string log;
    EXPECT_NE(testing::run_klein(base + " " + options, &log), 0) << options;
    EXPECT_NE(log.find(message), std::string::npos) << options << ": " << log;
  };
  refused("--strength 0.5", "--strength needs --init-image");
  for (const char* bad : {"0", "1.5", "-0.2", "nan"})
    refused("--init-image " + init.string() + " --strength " + bad, "--strength");
  // 4 steps at 0.2: int(0.8) = 0 steps would run.
  refused("-s 4 --init-image " + init.string() + " --strength 0.2", "runs no step");
  refused("--mask " + mask.string(), "--mask needs --init-image");
  refused("-W 64 -H 64 --mask " + mask.string() + " --init-image " + init.string(),
          "inpainting keeps the init image's size, 96x64");
  EXPECT_FALSE(fs::exists(target));
}

}  // namespace
}  // namespace klein
