// `klein tokenize` on a container: the tokenizer stored by `klein convert` gives the pipeline's
// input ids, whether the source's tokenizer/ had vocab.json + merges.txt or only the
// tokenizer.json official repositories ship; convert refuses a tokenizer that does not load.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "formats/container/reader.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<Ids> lines_of_ids(const std::string& output) {
  std::vector<Ids> lines;
  size_t start = 0;
  for (size_t eol; (eol = output.find('\n', start)) != std::string::npos; start = eol + 1) {
    const std::string line = output.substr(start, eol - start);
    if (line.starts_with("warning:")) continue;
    Ids ids;
    size_t pos = 0;
    while (pos < line.size()) {
      size_t used = 0;
      ids.push_back(std::stoi(line.substr(pos), &used));
      pos += used;
    }
    lines.push_back(ids);
  }
  return lines;
}

Ids read_ids_npy(const std::string& name) {
  std::vector<int64_t> v = read_npy(testing::tiny_vectors() / "tokenizer" / name).to_i64();
  return Ids(v.begin(), v.end());
}

// The tiny model as a diffusers directory whose tokenizer/ holds only tokenizer.json (the
// fixture tools/tokenizer_json writes at test time); every other part is a link to the original.
fs::path tiny_model_with_only_tokenizer_json(const fs::path& dir) {
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator(testing::tiny_model())) {
    if (entry.path().filename() == "tokenizer") continue;
    fs::create_symlink(entry.path(), dir / entry.path().filename());
  }
  fs::create_directory(dir / "tokenizer");
  fs::create_symlink(testing::tokenizer_json_fixture("merge-pairs"),
                     dir / "tokenizer" / "tokenizer.json");
  return dir;
}

// Every prompt of the golden vectors through `klein tokenize --template` gives the pipeline's
// padded ids and attention mask.
void expect_pipeline_inputs(const fs::path& model) {
  const json prompts = json::parse(
      read_text_file(testing::tiny_vectors() / "tokenizer" / "prompts.json"))["prompts"];
  ASSERT_EQ(prompts.size(), 3u);
  for (const json& p : prompts) {
    const std::string stem = "prompt" + std::to_string(p["index"].get<int>());
    SCOPED_TRACE(stem);
    std::string out;
    ASSERT_EQ(testing::run_klein("tokenize -m " + quoted(model.string()) + " --template -p " +
                                     quoted(p["prompt"].get<std::string>()),
                                 &out),
              0)
        << out;
    const std::vector<Ids> lines = lines_of_ids(out);
    ASSERT_EQ(lines.size(), 2u) << out;
    EXPECT_EQ(lines[0], read_ids_npy(stem + "_input_ids.npy"));
    EXPECT_EQ(lines[1], read_ids_npy(stem + "_attention_mask.npy"));
  }
}

std::vector<std::string> stored_tokenizer_files(const fs::path& path) {
  const container::ContainerFile container(path);
  std::vector<std::string> names;
  for (const auto& entry : container.metadata()["tokenizer"].items()) names.push_back(entry.key());
  return names;
}

TEST(TokenizeCli, ContainerFromVocabAndMerges) {
  const fs::path out = testing::temp_dir("tokenize-container");
  const fs::path container = out / "tiny.klein";
  std::string log;
  ASSERT_TRUE(testing::convert_tiny(container, "-t q8"));
  EXPECT_EQ(stored_tokenizer_files(container),
            (std::vector<std::string>{"merges.txt", "tokenizer_config.json", "vocab.json"}));
  expect_pipeline_inputs(container);

  // Raw ids: the same as from the source directory.
  std::string from_dir, from_container;
  ASSERT_EQ(testing::run_klein(
                "tokenize -m " + testing::tiny_model().string() + " 'hello <|im_start|> world'",
                &from_dir),
            0)
      << from_dir;
  ASSERT_EQ(testing::run_klein("tokenize -m " + container.string() + " 'hello <|im_start|> world'",
                               &from_container),
            0)
      << from_container;
  EXPECT_EQ(from_container, from_dir);
  EXPECT_EQ(from_dir, "14990 220 151644 1879\n");
}

TEST(TokenizeCli, ContainerFromOnlyTokenizerJson) {
  const fs::path out = testing::temp_dir("tokenize-container-json");
  const fs::path model = tiny_model_with_only_tokenizer_json(out / "model");
  expect_pipeline_inputs(model);  // the directory itself

  const fs::path container = out / "tiny.klein";
  std::string log;
  ASSERT_EQ(
      testing::run_klein("convert -m " + model.string() + " -t q8 -o " + container.string(), &log),
      0)
      << log;
  EXPECT_EQ(stored_tokenizer_files(container), (std::vector<std::string>{"tokenizer.json"}));
  expect_pipeline_inputs(container);
}

TEST(TokenizeCli, ConvertRefusesATokenizerThatDoesNotLoad) {
  const fs::path out = testing::temp_dir("tokenize-bad-tokenizer");
  const fs::path model = tiny_model_with_only_tokenizer_json(out / "model");
  fs::remove(model / "tokenizer" / "tokenizer.json");
  testing::write_text(model / "tokenizer" / "tokenizer.json",
                      R"({"model": {"type": "WordPiece", "vocab": {}}})");
  std::string log;
  EXPECT_EQ(testing::run_klein(
                "convert -m " + model.string() + " -t q8 -o " + (out / "bad.klein").string(), &log),
            1)
      << log;
  EXPECT_NE(log.find((model / "tokenizer" / "tokenizer.json").string()), std::string::npos) << log;
  EXPECT_NE(log.find("WordPiece"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "bad.klein"));
}

TEST(TokenizeCli, NeitherContainerNorTokenizerIsNamed) {
  const fs::path out = testing::temp_dir("tokenize-nothing");
  testing::write_text(out / "not-a-model.bin", "hello");
  std::string log;
  EXPECT_EQ(testing::run_klein("tokenize -m " + (out / "not-a-model.bin").string() + " hi", &log),
            1);
  EXPECT_NE(log.find((out / "not-a-model.bin").string() + ": no tokenizer found"),
            std::string::npos)
      << log;
  EXPECT_EQ(testing::run_klein("tokenize -m " + testing::tiny_model().string(), &log), 1);
  EXPECT_NE(log.find("give the text"), std::string::npos) << log;
  EXPECT_NE(testing::run_klein("tokenize -m " + testing::tiny_model().string() + " -p a b", &log),
            0);
}

// A directory holding only Mistral's tekken.json (tools/tekken/tekken_json.py writes the
// FLUX.2-dev test tokenizer as one): the ids the official implementation gives, and a path
// that is not there is named as such.
TEST(TokenizeCli, TekkenJsonDirectoryGivesTheOfficialIds) {
  const fs::path out = testing::temp_dir("tokenize-tekken");
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny";
  const std::string cmd = "/usr/bin/python3 " +
                          testing::shell_arg(fs::path(KLEIN_SOURCE_DIR) / "tools" / "tekken" / "tekken_json.py") +
                          " " + testing::shell_arg(dev / "model" / "tokenizer" / "tokenizer.json") + " " +
                          testing::shell_arg(out / "tekken.json");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json vectors = json::parse(read_text_file(dev / "tokenizer_vectors.json"));
  size_t checked = 0;
  for (const json& c : vectors["strings"]) {
    const std::string text = c["text"];
    if (text.empty() || text.find('\n') != std::string::npos || text.starts_with("-")) continue;
    std::string log;
    ASSERT_EQ(testing::run_klein("tokenize -m " + out.string() + " " + quoted(text), &log), 0) << log;
    const std::vector<Ids> lines = lines_of_ids(log);
    ASSERT_EQ(lines.size(), 1u) << log;
    EXPECT_EQ(lines[0], c["ids"].get<Ids>()) << text;
    if (++checked == 8) break;
  }
  EXPECT_EQ(checked, 8u);
  std::string log;
  EXPECT_EQ(testing::run_klein("tokenize -m " + (out / "absent").string() + " hi", &log), 1);
  EXPECT_NE(log.find((out / "absent").string() + " does not exist"), std::string::npos) << log;
}

}  // namespace
}  // namespace klein
