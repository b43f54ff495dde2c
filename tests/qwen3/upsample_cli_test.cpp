// `klein upsample` and `klein generate --upsample` end to end: with the reference's system
// message the rewrite is the text transformers' generate() decoded (upsample-tiny), from the
// diffusers directory and from a container converted with --keep-llm; a container without
// those layers is refused before any work; the image records both prompts and is the image
// of the rewritten prompt.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json case_json(const std::string& name) {
  std::ifstream in(testing::tiny_dir().parent_path() / "upsample-tiny" / "cases" / name /
                   "case.json");
  return json::parse(in);
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// `klein upsample ... --json` -> its JSON line.
json upsample_json(const std::string& args) {
  std::string log;
  EXPECT_EQ(testing::run_klein("upsample " + args + " --json", &log), 0) << log;
  const size_t at = log.find('{');
  if (at == std::string::npos) return json::object();
  return json::parse(log.substr(at, log.find('\n', at) - at));
}

TEST(UpsampleCli, GreedyRewriteIsTheOfficialTextFromDirectoryAndKeepLlmContainer) {
  const fs::path out = testing::temp_dir("upsample-cli");
  const json c = case_json("t2i");
  testing::write_text(out / "system.txt", c["system"].get<std::string>());
  testing::write_text(out / "prompt.txt", c["user"].get<std::string>());
  const std::string expected = trimmed(c["decoded"]["skip_special_tokens"].get<std::string>());
  const std::string args = " -p \"$(cat " + testing::shell_arg(out / "prompt.txt") +
                           ")\" --system " + testing::shell_arg(out / "system.txt") +
                           " --max-tokens 32 --threads 2";

  const json dir = upsample_json("-m " + testing::shell_arg(testing::tiny_model()) + args);
  EXPECT_EQ(dir.value("prompt", ""), expected);
  EXPECT_EQ(dir.value("new_tokens", 0), 32);
  EXPECT_EQ(dir.value("prompt_tokens", 0), int(c["input_ids"].size()));
  EXPECT_FALSE(dir.value("finished", true));

  ASSERT_TRUE(testing::convert_tiny(out / "llm.klein", "-t keep --keep-llm"));
  const json kept = upsample_json("-m " + testing::shell_arg(out / "llm.klein") + args);
  EXPECT_EQ(kept.value("prompt", ""), expected);
  std::string log;
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(out / "llm.klein"), &log), 0);
  EXPECT_NE(log.find("prompt upsampling: yes"), std::string::npos) << log;

  // Without --keep-llm: refused at once, the fix named; inspect says so too.
  ASSERT_TRUE(testing::convert_tiny(out / "plain.klein", "-t q8"));
  EXPECT_NE(testing::run_klein("upsample -m " + testing::shell_arg(out / "plain.klein") +
                                   " -p fox",
                               &log),
            0);
  EXPECT_NE(log.find("cannot upsample prompts: its text encoder lacks"), std::string::npos)
      << log;
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(out / "plain.klein") +
                                   " -p fox --upsample -W 32 -H 32 -o " +
                                   testing::shell_arg(out / "no.png"),
                               &log),
            0);
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;
  EXPECT_EQ(log.find("text encoder:"), std::string::npos)
      << "work started before the refusal: " << log;
  EXPECT_FALSE(fs::exists(out / "no.png"));
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(out / "plain.klein"), &log), 0);
  EXPECT_NE(log.find("prompt upsampling: no (convert with --keep-llm"), std::string::npos) << log;
}

TEST(UpsampleCli, SamplingRepeatsWithItsSeedAndOptionsAreChecked) {
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const json a = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 5");
  const json b = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 5");
  const json other = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 6");
  EXPECT_TRUE(a.value("sampling", false));
  EXPECT_EQ(a.value("seed", 0), 5);
  EXPECT_EQ(a.value("prompt", "?"), b.value("prompt", "!"));
  EXPECT_NE(a.value("prompt", "?"), other.value("prompt", "?"));
  std::string log;
  EXPECT_NE(testing::run_klein("upsample " + model + " -p fox --temperature 0", &log), 0);
  EXPECT_NE(log.find("--temperature: expected a number above 0"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("upsample " + model + " -p fox --system /nonexistent/sys.txt", &log),
            0);
  EXPECT_NE(log.find("/nonexistent/sys.txt"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("generate " + model + " -p fox --upsample --upsample-top-p 1.5 -o "
                               "/tmp/never.png",
                               &log),
            0);
  EXPECT_NE(log.find("--upsample-top-p: expected a number above 0 and at most 1"),
            std::string::npos)
      << log;
}

TEST(UpsampleCli, GenerateRecordsBothPromptsAndMakesTheImageOfTheRewrite) {
  const fs::path out = testing::temp_dir("upsample-generate");
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const std::string common = " -W 32 -H 48 -s 2 --seed 3 --no-cache -q --threads 2 ";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate " + model + " -p \"a red fox\" --upsample "
                                   "--upsample-max-tokens 12" + common + "-o " +
                                   testing::shell_arg(out / "up.png"),
                               &log),
            0)
      << log;
  const json up = upsample_json(model + " -p \"a red fox\" --max-tokens 12");
  const std::string rewritten = up.value("prompt", "");
  ASSERT_FALSE(rewritten.empty());
  const ImageMetadata meta = read_image_metadata(out / "up.png");
  std::string parameters, klein_json;
  for (const auto& [key, value] : meta) {
    if (key == "parameters") parameters = value;
    if (key == "klein") klein_json = value;
  }
  EXPECT_EQ(parameters.substr(0, rewritten.size() + 1), rewritten + "\n") << parameters;
  EXPECT_NE(parameters.find(", Original prompt: \"a red fox\""), std::string::npos) << parameters;
  const json j = json::parse(klein_json);
  EXPECT_EQ(j.value("prompt", ""), rewritten);
  EXPECT_EQ(j.value("original_prompt", ""), "a red fox");

  // The image is the one of the rewritten prompt given directly.
  testing::write_text(out / "rewritten.txt", rewritten);
  ASSERT_EQ(testing::run_klein("generate " + model + " -p \"$(cat " +
                                   testing::shell_arg(out / "rewritten.txt") + ")\"" + common +
                                   "-o " + testing::shell_arg(out / "direct.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(out / "up.png").rgb, load_image(out / "direct.png").rgb);
}

}  // namespace
}  // namespace klein
