// `klein upsample` and `klein generate --upsample` end to end against the text transformers'
// generate() decoded (upsample-tiny): with the reference's system message, from the diffusers
// directory, from a container converted with --keep-llm, and from the text encoder and
// tokenizer alone (no transformer, no VAE, no pairing check); `generate --upsample` uses the
// official rewrite, records both prompts and makes the image of the rewrite; edit instructions
// (`--edit`, `generate -r`) get the edit system message; a container without the language
// model's layers is refused before any work. Every file goes to the test's own directory.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using testing::upsample_dir;

json case_json(const std::string& name) {
  std::ifstream in(upsample_dir() / "cases" / name / "case.json");
  return json::parse(in);
}

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// The rewrite transformers decoded for a case (skip_special_tokens), as our output trims it.
std::string official(const json& c) {
  return trimmed(c["decoded"]["skip_special_tokens"].get<std::string>());
}

// `klein upsample ... --json` -> its JSON line.
json upsample_json(const std::string& args) { return testing::klein_json("upsample " + args); }

// The "upsampled" event of `klein generate --json` output (an empty object when none).
json upsampled_event(const std::string& log) {
  std::istringstream lines(log);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    const json j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "upsampled") return j;
  }
  ADD_FAILURE() << "no upsampled event in: " << log;
  return json::object();
}

class UpsampleCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir(std::string("upsample-cli-") +
                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The case's system message and user prompt as files in the test's directory, and the
  // options that give them with the case's token limit.
  std::string case_args(const json& c, const std::string& system_option = "--system") {
    const std::string name = c["name"].get<std::string>();
    testing::write_text(dir_ / (name + "-system.txt"), c["system"].get<std::string>());
    testing::write_text(dir_ / (name + "-prompt.txt"), c["user"].get<std::string>());
    return " -p \"$(cat " + testing::shell_arg(dir_ / (name + "-prompt.txt")) + ")\" " +
           system_option + " " + testing::shell_arg(dir_ / (name + "-system.txt")) + " ";
  }

  fs::path dir_;
};

TEST_F(UpsampleCli, GreedyRewriteIsTheOfficialTextFromDirectoryAndKeepLlmContainer) {
  const json c = case_json("t2i");
  const std::string args = case_args(c) + "--max-tokens 32 --threads 2";

  const json dir = upsample_json("-m " + testing::shell_arg(testing::tiny_model()) + args);
  EXPECT_EQ(dir.value("prompt", ""), official(c));
  EXPECT_EQ(dir.value("new_tokens", 0), 32);
  EXPECT_EQ(dir.value("prompt_tokens", 0), int(c["input_ids"].size()));
  EXPECT_FALSE(dir.value("finished", true));

  ASSERT_TRUE(testing::convert_tiny(dir_ / "llm.klein", "-t keep --keep-llm"));
  const json kept = upsample_json("-m " + testing::shell_arg(dir_ / "llm.klein") + args);
  EXPECT_EQ(kept.value("prompt", ""), official(c));
  std::string log;
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(dir_ / "llm.klein"), &log), 0);
  EXPECT_NE(log.find("prompt upsampling: yes"), std::string::npos) << log;

  // Without --keep-llm: refused at once, the fix named; inspect says so too.
  ASSERT_TRUE(testing::convert_tiny(dir_ / "plain.klein", "-t q8"));
  EXPECT_NE(testing::run_klein(
                "upsample -m " + testing::shell_arg(dir_ / "plain.klein") + " -p fox", &log),
            0);
  EXPECT_NE(log.find("cannot upsample prompts: its text encoder lacks"), std::string::npos) << log;
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(dir_ / "plain.klein") +
                                   " -p fox --upsample -W 32 -H 32 -o " +
                                   testing::shell_arg(dir_ / "no.png"),
                               &log),
            0);
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;
  EXPECT_EQ(log.find("text encoder:"), std::string::npos)
      << "work started before the refusal: " << log;
  EXPECT_FALSE(fs::exists(dir_ / "no.png"));
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(dir_ / "plain.klein"), &log), 0);
  EXPECT_NE(log.find("prompt upsampling: no (convert with --keep-llm"), std::string::npos) << log;
}

// The language model and its tokenizer are all upsampling reads: Qwen3-8B's untied layout
// (klein-9B's text encoder, its own lm_head, stopping on <|endoftext|>) and the tied one of
// Qwen3-4B, each given as --text-encoder FILE --tokenizer DIR without a transformer or VAE.
TEST_F(UpsampleCli, TheTextEncoderAndItsTokenizerAloneAreEnough) {
  const std::string tokenizer =
      " --tokenizer " + testing::shell_arg(testing::tiny_model() / "tokenizer");
  const json eos = case_json("untied_eos");
  const json untied =
      upsample_json("--text-encoder " +
                    testing::shell_arg(upsample_dir() / "model-untied" / "text_encoder" /
                                       "model.safetensors.index.json") +
                    tokenizer + case_args(eos) + "--max-tokens 32 --threads 2");
  EXPECT_EQ(untied.value("prompt", ""), official(eos));
  EXPECT_EQ(untied.value("prompt_tokens", 0), int(eos["input_ids"].size()));
  EXPECT_EQ(untied.value("new_tokens", 0), int(eos["generated_ids"].size()));
  EXPECT_TRUE(untied.value("finished", false));

  const json t2i = case_json("t2i");
  const json tied = upsample_json(
      "--text-encoder " +
      testing::shell_arg(testing::tiny_model() / "text_encoder" / "model.safetensors.index.json") +
      tokenizer + case_args(t2i) + "--max-tokens 32 --threads 2");
  EXPECT_EQ(tied.value("prompt", ""), official(t2i));
  EXPECT_EQ(tied.value("new_tokens", 0), 32);

  // What is still missing is named: the tokenizer of a safetensors file, or any text encoder.
  std::string log;
  EXPECT_NE(testing::run_klein("upsample -p fox --text-encoder " +
                                   testing::shell_arg(testing::tiny_model() / "text_encoder" /
                                                      "model.safetensors.index.json"),
                               &log),
            0);
  EXPECT_NE(log.find("give --tokenizer DIR"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("upsample -p fox" + tokenizer, &log), 0);
  EXPECT_NE(log.find("no text encoder given: give -m DIR or --text-encoder FILE"),
            std::string::npos)
      << log;
}

// A diffusers directory is read for its text encoder and tokenizer only: one whose transformer
// does not pair with its text encoder (generate refuses it) upsamples as the reference, and so
// does one without transformer/ and vae/.
TEST_F(UpsampleCli, ADirectoryIsReadForItsTextEncoderOnly) {
  const fs::path tiny = testing::tiny_model();
  const fs::path mixed = dir_ / "mixed";
  fs::create_directories(mixed);
  // Links only: the shared data is untouched.
  fs::create_symlink(tiny / "model_index.json", mixed / "model_index.json");
  for (const char* part : {"text_encoder", "tokenizer", "scheduler", "vae"})
    fs::create_directory_symlink(tiny / part, mixed / part);
  // klein-tiny-9b's transformer reads a context of 3 x 32; klein-tiny's encoder gives 3 x 64.
  fs::create_directory_symlink(
      fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "klein-tiny-9b" / "model" / "transformer",
      mixed / "transformer");
  std::string log;
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(mixed) +
                                   " -p fox --upsample -W 32 -H 32 --no-cache -o " +
                                   testing::shell_arg(dir_ / "no.png"),
                               &log),
            0);
  EXPECT_NE(log.find("expects a text context"), std::string::npos) << log;

  const json c = case_json("t2i");
  const std::string args = case_args(c) + "--max-tokens 32 --threads 2";
  EXPECT_EQ(upsample_json("-m " + testing::shell_arg(mixed) + args).value("prompt", ""),
            official(c));

  fs::remove(mixed / "transformer");
  fs::remove(mixed / "vae");
  EXPECT_EQ(upsample_json("-m " + testing::shell_arg(mixed) + args).value("prompt", ""),
            official(c));
}

// Edit instructions: `generate -r` with the reference's system message gives the official
// rewrite of its edit case; without one, `klein upsample --edit` and `generate -r` use our
// edit system message, which rewrites otherwise than the text-to-image one.
TEST_F(UpsampleCli, EditInstructionsGetTheEditSystemMessage) {
  const json c = case_json("edit");
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const std::string reference =
      " -r " + testing::shell_arg(testing::tiny_vectors() / "inputs" / "ref0.png");
  const std::string common = " -W 32 -H 32 -s 1 --seed 3 --no-cache --threads 2 --json ";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate " + model + reference + case_args(c, "--upsample-system") +
                                   "--upsample --upsample-max-tokens 32" + common + "-o " +
                                   testing::shell_arg(dir_ / "edit.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(upsampled_event(log).value("prompt", ""), official(c));

  // Ours: the same user prompt, 12 tokens.
  testing::write_text(dir_ / "user.txt", c["user"].get<std::string>());
  const std::string user = " -p \"$(cat " + testing::shell_arg(dir_ / "user.txt") + ")\" ";
  const std::string edit =
      upsample_json(model + user + "--max-tokens 12 --threads 2 --edit").value("prompt", "");
  const std::string text_to_image =
      upsample_json(model + user + "--max-tokens 12 --threads 2").value("prompt", "");
  ASSERT_FALSE(edit.empty());
  EXPECT_NE(edit, text_to_image) << "--edit rewrote as for text to image";
  ASSERT_EQ(testing::run_klein("generate " + model + reference + user +
                                   "--upsample --upsample-max-tokens 12" + common + "-o " +
                                   testing::shell_arg(dir_ / "ours.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(upsampled_event(log).value("prompt", ""), edit);
}

TEST_F(UpsampleCli, SamplingRepeatsWithItsSeedAndOptionsAreChecked) {
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const json a = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 5");
  const json b = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 5");
  const json other = upsample_json(model + " -p \"a fox\" --max-tokens 10 --seed 6");
  EXPECT_TRUE(a.value("sampling", false));
  EXPECT_EQ(a.value("seed", 0), 5);
  EXPECT_EQ(a.value("prompt", "?"), b.value("prompt", "!"));
  EXPECT_NE(a.value("prompt", "?"), other.value("prompt", "?"));
  // A temperature of 0 is greedy decoding: the default's tokens, no seed.
  const json zero = upsample_json(model + " -p \"a fox\" --max-tokens 10 --temperature 0");
  const json greedy = upsample_json(model + " -p \"a fox\" --max-tokens 10");
  EXPECT_FALSE(zero.value("sampling", true));
  EXPECT_FALSE(zero.contains("seed"));
  EXPECT_EQ(zero.value("prompt", "?"), greedy.value("prompt", "!"));
  std::string log;
  EXPECT_NE(testing::run_klein("upsample " + model + " -p fox --temperature -1", &log), 0);
  EXPECT_NE(log.find("--temperature: expected 0 (greedy) to 10"), std::string::npos) << log;
  const fs::path missing = dir_ / "nonexistent" / "sys.txt";
  EXPECT_NE(testing::run_klein(
                "upsample " + model + " -p fox --system " + testing::shell_arg(missing), &log),
            0);
  EXPECT_NE(log.find(missing.string()), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("generate " + model + " -p fox --upsample --upsample-top-p 1.5 -o " +
                                   testing::shell_arg(dir_ / "never.png"),
                               &log),
            0);
  EXPECT_NE(log.find("--upsample-top-p: expected a number above 0 and at most 1"),
            std::string::npos)
      << log;
  EXPECT_FALSE(fs::exists(dir_ / "never.png"));
}

// `generate --upsample` encodes the official rewrite (with the reference's system message),
// records both prompts, and makes the image the rewrite given directly makes.
TEST_F(UpsampleCli, GenerateUsesTheOfficialRewriteAndRecordsBothPrompts) {
  const json c = case_json("t2i");
  const std::string rewritten = official(c);
  const std::string user = c["user"].get<std::string>();
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const std::string common = " -W 32 -H 48 -s 2 --seed 3 --no-cache --threads 2 ";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate " + model + case_args(c, "--upsample-system") +
                                   "--upsample --upsample-max-tokens 32 --json" + common + "-o " +
                                   testing::shell_arg(dir_ / "up.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(upsampled_event(log).value("prompt", ""), rewritten);
  const ImageMetadata meta = read_image_metadata(dir_ / "up.png");
  std::string parameters, klein_json;
  for (const auto& [key, value] : meta) {
    if (key == "parameters") parameters = value;
    if (key == "klein") klein_json = value;
  }
  EXPECT_EQ(parameters.substr(0, rewritten.size() + 1), rewritten + "\n") << parameters;
  EXPECT_NE(parameters.find(", Original prompt: \"" + user + "\""), std::string::npos)
      << parameters;
  const json j = json::parse(klein_json, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << klein_json;
  EXPECT_EQ(j.value("prompt", ""), rewritten);
  EXPECT_EQ(j.value("original_prompt", ""), user);

  // The image is the one of the rewritten prompt given directly.
  testing::write_text(dir_ / "rewritten.txt", rewritten);
  ASSERT_EQ(testing::run_klein("generate " + model + " -q -p \"$(cat " +
                                   testing::shell_arg(dir_ / "rewritten.txt") + ")\"" + common +
                                   "-o " + testing::shell_arg(dir_ / "direct.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(dir_ / "up.png").rgb, load_image(dir_ / "direct.png").rgb);
}

}  // namespace
}  // namespace klein
