// tokenizer.json, the file the official repositories ship: the fixtures of
// tests/data/tokenizer-json (the tiny model's tokenizer in the exact layout the Hugging Face
// tokenizers library writes, merges as strings and as pairs; tools/tokenizer_json) give the
// golden ids from a directory holding only that file, with or without tokenizer_config.json.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/npy.h"
#include "support/testing.h"
#include "tokenizer/klein_prompt.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

fs::path fixture(const std::string& variant) {
  return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "tokenizer-json" / variant /
         "tokenizer.json";
}

json read_vector_json(const std::string& name) {
  return json::parse(read_text_file(testing::tiny_vectors() / "tokenizer" / name));
}

Ids read_ids_npy(const std::string& name) {
  std::vector<int64_t> v = read_npy(testing::tiny_vectors() / "tokenizer" / name).to_i64();
  return Ids(v.begin(), v.end());
}

// A tokenizer directory with the fixture's tokenizer.json and nothing else, or with the tiny
// model's tokenizer_config.json beside it.
fs::path fast_dir(const std::string& variant, bool with_config) {
  const fs::path dir =
      testing::temp_dir("tokenizer-json-" + variant + (with_config ? "-config" : ""));
  fs::create_symlink(fs::absolute(fixture(variant)), dir / "tokenizer.json");
  if (with_config)
    fs::copy_file(testing::tiny_model() / "tokenizer" / "tokenizer_config.json",
                  dir / "tokenizer_config.json");
  return dir;
}

class TokenizerJsonFixture : public ::testing::TestWithParam<std::tuple<const char*, bool>> {};

TEST_P(TokenizerJsonFixture, GivesTheGoldenIds) {
  const auto [variant, with_config] = GetParam();
  const Tokenizer t = Tokenizer::from_directory(fast_dir(variant, with_config));
  const Tokenizer slow = Tokenizer::from_directory(testing::tiny_model() / "tokenizer");
  EXPECT_EQ(t.vocab_size(), slow.vocab_size());
  EXPECT_EQ(t.merge_count(), slow.merge_count());
  ASSERT_EQ(t.added_tokens().size(), slow.added_tokens().size());
  for (size_t i = 0; i < t.added_tokens().size(); ++i) {
    EXPECT_EQ(t.added_tokens()[i].id, slow.added_tokens()[i].id);
    EXPECT_EQ(t.added_tokens()[i].content, slow.added_tokens()[i].content);
    EXPECT_EQ(t.added_tokens()[i].special, slow.added_tokens()[i].special);
  }

  const json cases = read_vector_json("strings.json")["cases"];
  ASSERT_GE(cases.size(), 60u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    SCOPED_TRACE("case " + std::to_string(c["index"].get<int>()) + ": " + text.substr(0, 60));
    const Ids ids = t.encode(text);
    EXPECT_EQ(ids, c["ids"].get<Ids>());
    EXPECT_EQ(t.decode(ids), c["decoded"].get<std::string>());
  }

  const json prompts = read_vector_json("prompts.json")["prompts"];
  ASSERT_EQ(prompts.size(), 3u);
  for (const json& p : prompts) {
    const std::string stem = "prompt" + std::to_string(p["index"].get<int>());
    SCOPED_TRACE(stem);
    const KleinPromptTokens got = tokenize_klein_prompt(t, p["prompt"].get<std::string>());
    EXPECT_EQ(got.ids, read_ids_npy(stem + "_input_ids.npy"));
    EXPECT_EQ(got.mask, read_ids_npy(stem + "_attention_mask.npy"));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TokenizerJsonFixture,
                         ::testing::Combine(::testing::Values("merge-strings", "merge-pairs"),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param);
                           name.erase(name.find('-'), 1);
                           return name + (std::get<1>(info.param) ? "WithConfig" : "Alone");
                         });

// The two fixtures are one tokenizer: the same vocabulary and merges in both spellings.
TEST(TokenizerJsonFixtureFiles, HaveTheLayoutTokenizersWrites) {
  for (const char* variant : {"merge-strings", "merge-pairs"}) {
    SCOPED_TRACE(variant);
    const std::string text = read_text_file(fixture(variant));
    ASSERT_TRUE(text.starts_with("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n"));
    const json j = json::parse(text);
    EXPECT_EQ(j["normalizer"]["type"], "NFC");
    EXPECT_EQ(j["pre_tokenizer"]["type"], "Sequence");
    EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][0]["type"], "Split");
    EXPECT_EQ(j["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
    EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
    EXPECT_EQ(j["model"]["type"], "BPE");
    const json& first = j["model"]["merges"][0];
    EXPECT_EQ(first, std::string(variant) == "merge-pairs" ? json::array({"Ġ", "Ġ"}) : json("Ġ Ġ"));
  }
}

}  // namespace
}  // namespace klein
