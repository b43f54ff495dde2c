// FLUX.2-dev from a prompt, through the CLI, against the official Flux2Pipeline run whole on the
// tiny dev model (tests/data/flux2-dev-tiny, vectors/e2e_prompt: the official tokenizers
// library's ids, the Mistral3 context, the image): from the diffusers directory and from a
// container of it; what the dev pipeline refuses.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using testing::shell_arg;

using testing::dev_set;
fs::path dev_model() { return dev_set() / "model"; }

// The spec's first e2e_prompt case as generate arguments, dumping into out/dump.
std::string dev_run(const fs::path& out, const nlohmann::json& c, const fs::path& ref) {
  return "-p " + shell_arg(c["prompt"].get<std::string>()) + " -W " +
         std::to_string(c["width"].get<int>()) + " -H " + std::to_string(c["height"].get<int>()) +
         " -s " + std::to_string(c["steps"].get<int>()) + " -g " +
         std::to_string(c["guidance"].get<double>()) + " --noise " + shell_arg(ref / "noise.npy") +
         " --no-cache --threads 2 -q --dump " + shell_arg(out / "dump") + " -o " +
         shell_arg(out / "image.png");
}

nlohmann::json prompt_case() {
  std::ifstream in(dev_set() / "spec.json");
  return nlohmann::json::parse(in)["e2e_prompt"][0];
}

void expect_like_the_official_run(const fs::path& out, const fs::path& ref, const nlohmann::json& c) {
  const std::vector<float> embeds = read_npy(out / "dump" / "prompt_embeds.npy").to_f32();
  EXPECT_TRUE(testing::matches_npy(embeds.data(), int64_t(embeds.size()), ref / "prompt_embeds.npy",
                                   1e-4));
  testing::expect_png_matches(out / "image.png", ref / "image.png", c["width"].get<int>(),
                              c["height"].get<int>());
}

TEST(Flux2Dev, PromptToImageMatchesTheOfficialPipeline) {
  const nlohmann::json c = prompt_case();
  const fs::path ref = dev_set() / "vectors" / "e2e_prompt" / c["name"].get<std::string>();
  const fs::path out = testing::temp_dir("dev-e2e");
  std::string log;
  ASSERT_EQ(testing::run_klein("generate -m " + shell_arg(dev_model()) + " " + dev_run(out, c, ref),
                               &log), 0) << log;
  // The guidance took effect (it is embedded): nothing says it was ignored.
  EXPECT_EQ(log.find("no effect"), std::string::npos) << log;
  // The ids the engine gave the text encoder are the official tokenizer's, padded as the
  // pipeline pads them.
  const std::vector<float> embeds = read_npy(out / "dump" / "prompt_embeds.npy").to_f32();
  EXPECT_EQ(embeds.size(), size_t(512 * 144));
  expect_like_the_official_run(out, ref, c);
  // The metadata records the embedded guidance (it shaped the image) and labels it so.
  std::string parameters, record;
  for (const auto& [k, v] : read_image_metadata(out / "image.png")) {
    if (k == "parameters") parameters = v;
    if (k == "klein") record = v;
  }
  ASSERT_FALSE(record.empty());
  EXPECT_EQ(nlohmann::json::parse(record)["guidance"], c["guidance"]);
  EXPECT_NE(parameters.find("Guidance: 4"), std::string::npos) << parameters;
}

TEST(Flux2Dev, ContainerMakesTheSameImage) {
  const nlohmann::json c = prompt_case();
  const fs::path ref = dev_set() / "vectors" / "e2e_prompt" / c["name"].get<std::string>();
  const fs::path out = testing::temp_dir("dev-container");
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + shell_arg(dev_model()) + " -t bf16 -o " +
                                   shell_arg(out / "dev.klein") + " -q", &log), 0) << log;
  ASSERT_EQ(testing::run_klein("inspect -m " + shell_arg(out / "dev.klein"), &log), 0) << log;
  EXPECT_NE(log.find("FLUX.2-dev"), std::string::npos) << log;
  ASSERT_EQ(testing::run_klein("generate -m " + shell_arg(out / "dev.klein") + " " +
                                   dev_run(out, c, ref), &log), 0) << log;
  expect_like_the_official_run(out, ref, c);
}

// (Upsampling runs: tests/flux2_dev/upsample_test.cpp.)
TEST(Flux2Dev, ImageToImageIsRefusedByName) {
  const fs::path out = testing::temp_dir("dev-refusals");
  std::string log;
  const fs::path init = dev_set() / "vectors" / "e2e" / "edit_h64_w64" / "reference0.png";
  EXPECT_NE(testing::run_klein("generate -m " + shell_arg(dev_model()) + " -p cat --init-image " +
                                   shell_arg(init) + " -o " + shell_arg(out / "x.png"), &log), 0);
  EXPECT_NE(log.find("FLUX.2-dev's pipeline has no image-to-image"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "x.png"));
}

}  // namespace
}  // namespace klein
