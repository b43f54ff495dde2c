// Z-Image LoRAs at run time (--lora) and merged by convert, against the reference merge:
// tools/lora/lora_fixture.py writes LoRA files for the tiny Z-Image transformer in the
// diffusers/PEFT, original (ComfyUI, musubi-tuner) and kohya spellings, and merges them into
// its weights in float64, reading the names as diffusers' Z-Image LoRA loader does. `generate`
// on the merged weights is what `generate --lora` on the original weights must give.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using testing::shell_arg;

using testing::kSource;

using testing::zimage_model;
fs::path zimage_transformer() {
  return zimage_model() / "transformer" / "diffusion_pytorch_model.safetensors";
}

fs::path fixtures() { return testing::zimage_lora_fixtures(); }
std::string fixture(const std::string& file) { return shell_arg(fixtures() / file); }

// The tiny Z-Image model with its transformer's weights replaced by the reference merge of
// `loras` ("FILE[:SCALE] ..."): the other components and every config linked.
fs::path merged_model(const fs::path& dir, const std::string& loras) {
  const fs::path model = dir / "merged-model";
  fs::create_directories(model / "transformer");
  for (const char* part : {"model_index.json", "scheduler", "text_encoder", "tokenizer", "vae"})
    fs::create_symlink(zimage_model() / part, model / part);
  fs::create_symlink(zimage_model() / "transformer" / "config.json",
                     model / "transformer" / "config.json");
  const std::string cmd =
      "python3 " + shell_arg(kSource / "tools" / "lora" / "lora_fixture.py") + " merge-zimage " +
      shell_arg(zimage_transformer()) + " " +
      shell_arg(model / "transformer" / "diffusion_pytorch_model.safetensors") + " " + loras;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return model;
}

// Every step's latents and the final ones within 1e-4 scaled; the images within a grey level.
void expect_same_generation(const fs::path& dir, const std::string& got, const std::string& want) {
  for (std::string f : {"step0_latents_out", "step1_latents_out", "step2_latents_out",
                        "step3_latents_out", "final_latents"}) {
    const std::vector<float> g = read_npy(dir / got / (f + ".npy")).to_f32();
    EXPECT_TRUE(testing::matches_npy(g.data(), int64_t(g.size()), dir / want / (f + ".npy"), 1e-4))
        << f;
  }
  testing::expect_png_matches(dir / (got + ".png"), dir / (want + ".png"), 64, 64);
}

TEST(ZImageLora, EverySpellingMatchesTheReferenceMergeAtEveryStep) {
  const fs::path dir = testing::temp_dir("zimage-lora");
  const std::string peft = fixture("zimage-peft.safetensors");
  const std::string comfy = fixture("zimage-comfy.safetensors");
  const std::string kohya = fixtures().string() + "/zimage-kohya.safetensors:0.7";
  const fs::path merged = merged_model(dir, peft + " " + comfy + " " + shell_arg(kohya));
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(merged), dir, "merged"));
  const std::string model = " -m " + shell_arg(zimage_model());
  ASSERT_TRUE(testing::generate_compared_run(
      model + " --lora " + peft + " --lora " + comfy + " --lora " + shell_arg(kohya), dir,
      "lora"));
  expect_same_generation(dir, "lora", "merged");

  // The adapters change the image (the comparison above could not pass without them), and
  // the metadata names them.
  ASSERT_TRUE(testing::generate_compared_run(model, dir, "plain"));
  EXPECT_NE(read_text_file(dir / "plain.png"), read_text_file(dir / "lora.png"));
  EXPECT_NE(read_text_file(dir / "lora.png").find("LoRA: "), std::string::npos);
}

// `convert --lora` merges before storing: an f32 container made that way gives the reference
// merge's generation.
TEST(ZImageLora, MergedByConvertMatchesTheReferenceMerge) {
  const fs::path dir = testing::temp_dir("zimage-lora-convert");
  const std::string comfy = fixture("zimage-comfy.safetensors");
  const std::string kohya = shell_arg(fixtures().string() + "/zimage-kohya.safetensors:-0.5");
  const fs::path merged = merged_model(dir, comfy + " " + kohya);
  const fs::path container = dir / "merged.klein";
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + shell_arg(zimage_model()) + " --lora " + comfy +
                                   " --lora " + kohya + " -t f32 -q -o " + shell_arg(container),
                               &log),
            0)
      << log;
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(merged), dir, "reference"));
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(container), dir, "container"));
  expect_same_generation(dir, "container", "reference");
}

// A klein LoRA given to Z-Image (and the other way round) is refused before any work, naming
// the file and the module.
TEST(ZImageLora, AnotherFamilysLoraIsRefusedByName) {
  const fs::path dir = testing::temp_dir("zimage-lora-refused");
  struct Case {
    fs::path model, lora;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {zimage_model(), testing::lora_fixtures() / "bfl.safetensors",
            "is not a linear weight of this Z-Image transformer"},
           {zimage_model(), testing::lora_fixtures() / "kohya.safetensors",
            "is not a linear weight of this Z-Image transformer"},
           {testing::tiny_model(), fixtures() / "zimage-kohya.safetensors",
            "is not a FLUX.2-klein transformer module"},
           {testing::tiny_model(), fixtures() / "zimage-peft.safetensors",
            "is not a linear weight of this FLUX.2-klein transformer"}}) {
    std::string log;
    const fs::path out = dir / "out.png";
    EXPECT_NE(testing::run_klein("generate -m " + shell_arg(c.model) + " --lora " +
                                     shell_arg(c.lora) + " -p x -W 32 -H 32 -s 1 -q -o " +
                                     shell_arg(out),
                                 &log),
              0)
        << c.lora;
    EXPECT_NE(log.find(c.expected), std::string::npos) << c.lora << ": " << log;
    EXPECT_NE(log.find(c.lora.filename().string()), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(out));
  }
}

}  // namespace
}  // namespace klein
