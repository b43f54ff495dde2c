// An empty prompt is a prompt: `klein generate -p ""` makes an unconditional image, as the
// official pipelines do for prompt="" (and for the negative prompt they default to ""). Z-Image's
// official text encoder run of "" is golden data (zimage-tiny/vectors/text_encoder); for
// FLUX.2-klein, which has no such vector, the image is checked to be deterministic and not the
// image of another prompt. Leaving -p out without --prompts is still refused.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string metadata(const fs::path& image, const std::string& key) {
  for (const auto& [k, v] : read_image_metadata(image))
    if (k == key) return v;
  return "";
}

// `klein generate -m MODEL PROMPT_ARGS ... -o OUT` on 64x64, one step, seed 3.
std::string generate_args(const fs::path& model, const std::string& prompt_args,
                          const fs::path& out) {
  return "generate -m " + testing::shell_arg(model) + " " + prompt_args +
         " -W 64 -H 64 -s 1 --seed 3 --no-cache --threads 2 -q -o " + testing::shell_arg(out);
}

TEST(EmptyPromptCli, MakesADeterministicImageOfItsOwn) {
  const fs::path out = testing::temp_dir("empty-prompt-cli");
  std::string log;
  ASSERT_EQ(testing::run_klein(generate_args(testing::tiny_model(), "-p ''", out / "a.png"), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein(generate_args(testing::tiny_model(), "--prompt ''", out / "b.png"), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein(generate_args(testing::tiny_model(), "-p 'a small red cube'",
                                             out / "c.png"),
                               &log),
            0)
      << log;
  const Image a = load_image(out / "a.png"), b = load_image(out / "b.png"),
              c = load_image(out / "c.png");
  ASSERT_EQ(a.rgb.size(), size_t(64 * 64 * 3));
  EXPECT_EQ(a.rgb, b.rgb);  // the same empty prompt, however it is spelled, the same image
  EXPECT_NE(a.rgb, c.rgb);  // the empty prompt is not ignored in favour of anything else
  json m = json::parse(metadata(out / "a.png", "klein"));
  EXPECT_EQ(m["prompt"], "");
  EXPECT_EQ(m["seed"], 3);
  // A1111's parameters text: the prompt line, empty, then the settings.
  EXPECT_TRUE(metadata(out / "a.png", "parameters").starts_with("\nSteps: 1, "))
      << metadata(out / "a.png", "parameters");

  // --batch of the empty prompt: image i is the one of seed 3 + i, the first the image above.
  ASSERT_EQ(testing::run_klein(generate_args(testing::tiny_model(), "-p '' --batch 2",
                                             out / "batch.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(out / "batch-0.png").rgb, a.rgb);
}

// Z-Image: the features of "" the CLI hands the transformer are the official text encoder's
// (ZImagePipeline's default negative prompt, prompt 3 of the set's tokenizer vectors).
TEST(EmptyPromptCli, ZImageEncodesItAsTheOfficialPipeline) {
  const fs::path zimage = testing::tiny_dir().parent_path() / "zimage-tiny";
  const json prompts =
      json::parse(read_text_file(zimage / "vectors" / "tokenizer" / "prompts.json"))["prompts"];
  int index = -1;
  for (const json& p : prompts)
    if (p["prompt"] == "") index = p["index"].get<int>();
  ASSERT_GE(index, 0) << "no empty prompt among the Z-Image vectors";
  const fs::path out = testing::temp_dir("empty-prompt-zimage");
  std::string log;
  ASSERT_EQ(testing::run_klein(generate_args(zimage / "model", "-p '' --dump " +
                                                                  testing::shell_arg(out / "dump"),
                                             out / "image.png"),
                               &log),
            0)
      << log;
  const std::vector<float> got = read_npy(out / "dump" / "prompt_embeds.npy").to_f32();
  EXPECT_TRUE(testing::matches_npy(
      got.data(), int64_t(got.size()),
      zimage / "vectors" / "text_encoder" / ("prompt" + std::to_string(index) + "_embeds.npy"),
      1e-4));
}

// Without -p and without --prompts there is no prompt: refused with the options named, before
// any work; -p "" with --prompts is two prompts' sources, refused too.
TEST(EmptyPromptCli, AMissingPromptIsStillRefused) {
  const fs::path out = testing::temp_dir("empty-prompt-missing");
  testing::write_text(out / "prompts.txt", "a small red cube\n");
  const std::pair<std::string, std::string> cases[] = {
      {"", "-p/--prompt or --prompts FILE is required"},
      {"-p '' --prompts " + testing::shell_arg(out / "prompts.txt"), "give one"},
  };
  for (const auto& [args, expected] : cases) {
    std::string log;
    EXPECT_NE(testing::run_klein(generate_args(testing::tiny_model(), args, out / "a.png"), &log), 0)
        << args;
    EXPECT_NE(log.find(expected), std::string::npos) << args << ": " << log;
    EXPECT_EQ(log.find("text encoder"), std::string::npos) << args << ": work started";
  }
  EXPECT_FALSE(fs::exists(out / "a.png"));
}

}  // namespace
}  // namespace klein
