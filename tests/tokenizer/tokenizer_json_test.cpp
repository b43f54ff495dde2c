// tokenizer.json, the file the official repositories ship: the fixtures that
// tools/tokenizer_json writes at test time (the tiny model's tokenizer in the exact layout the
// Hugging Face tokenizers library writes, merges as strings and as pairs) give the
// golden ids from a directory holding only that file, with or without tokenizer_config.json;
// malformed files fail with messages that name the file.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <initializer_list>
#include <string_view>

#include "core/error.h"
#include "core/files.h"
#include "core/npy.h"
#include "families/flux2_klein/prompt.h"
#include "support/testing.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

fs::path fixture(const std::string& variant) { return testing::tokenizer_json_fixture(variant); }

json read_vector_json(const std::string& name) {
  return json::parse(read_text_file(testing::tiny_vectors() / "tokenizer" / name));
}

Ids golden_ids(const std::string& name) {
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
    const PromptTokens got = tokenize_klein_prompt(t, p["prompt"].get<std::string>());
    EXPECT_EQ(got.ids, golden_ids(stem + "_input_ids.npy"));
    EXPECT_EQ(got.mask, golden_ids(stem + "_attention_mask.npy"));
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

// ---------------------------------------------------------------------------------------
// Malformed files in a directory: the message names the file and what was expected.

// A byte-level vocabulary of the 256 single bytes (id = byte value) and "ab" = 256.
std::string small_vocab() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::bytes_to_symbols(std::string(1, char(b)))] = b;
  vocab["ab"] = 256;
  return vocab.dump();
}

struct Files {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // not written when empty
};

// The message of loading `files` from a fresh directory, which must name its file.
std::string error_loading(const Files& files, const char* culprit = "tokenizer.json") {
  static int n = 0;
  const fs::path dir = testing::temp_dir("tokenizer-json-bad-" + std::to_string(n++));
  testing::write_text(dir / "tokenizer.json", files.tokenizer_json);
  if (!files.tokenizer_config_json.empty())
    testing::write_text(dir / "tokenizer_config.json", files.tokenizer_config_json);
  const std::string message = testing::error_of([&] { Tokenizer::from_directory(dir); });
  EXPECT_NE(message.find((dir / culprit).string()), std::string::npos)
      << "\"" << message << "\" does not name " << (dir / culprit).string();
  return message;
}

// A tokenizer.json whose model has the small vocabulary, `merges` and `more` model fields.
std::string with_model(const std::string& merges, const std::string& more = "",
                       const std::string& added = "[]") {
  return R"({"version": "1.0", "added_tokens": )" + added + R"(, "model": {"type": "BPE", )" +
         more + R"("vocab": )" + small_vocab() + R"(, "merges": )" + merges + "}}";
}

void expect_parts(const std::string& message, std::initializer_list<std::string_view> parts) {
  for (std::string_view p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "\"" << message << "\" lacks \"" << p << "\"";
}

TEST(TokenizerJsonErrors, WellFormedSmallFileLoads) {
  // The base of the cases below, so that each of them fails for its own reason only.
  const fs::path dir = testing::temp_dir("tokenizer-json-good");
  testing::write_text(dir / "tokenizer.json",
                      with_model(R"([["a", "b"]])", R"("ignore_merges": false, "dropout": null, )",
                                 R"([{"id": 300, "content": "<x>", "special": true}])"));
  const Tokenizer t = Tokenizer::from_directory(dir);
  EXPECT_EQ(t.encode("ab<x>ba"), (Ids{256, 300, 'b', 'a'}));
}

TEST(TokenizerJsonErrors, WrongModel) {
  expect_parts(error_loading({R"({"model": {"type": "Unigram", "vocab": [["a", -1.0]]}})"}),
               {"model.type", "\"Unigram\"", "expected \"BPE\""});
  expect_parts(error_loading({R"({"model": {"type": 3, "vocab": {}}})"}),
               {"model.type", "expected \"BPE\""});
  expect_parts(error_loading({R"({"model": {"type": "BPE", "merges": ["a b"]}})"}),
               {"model.vocab", "missing"});
  expect_parts(error_loading({R"({"added_tokens": []})"}), {"model.", "missing"});
  expect_parts(error_loading({R"([1, 2, 3])"}), {"model.", "missing"});
  expect_parts(error_loading({with_model("[]")}), {"model.merges", "missing or empty"});
  expect_parts(error_loading({with_model(R"(["a b"])").substr(0, 500)}), {"not valid JSON"});
}

TEST(TokenizerJsonErrors, SettingsThatWouldChangeTheIds) {
  expect_parts(error_loading({with_model(R"(["a b"])", R"("byte_fallback": true, )")}),
               {"model.byte_fallback", "not supported"});
  expect_parts(error_loading({with_model(R"(["a b"])", R"("continuing_subword_prefix": "##", )")}),
               {"model.continuing_subword_prefix", "\"##\"", "not supported"});
  expect_parts(error_loading({with_model(R"(["a b"])", R"("end_of_word_suffix": "</w>", )")}),
               {"model.end_of_word_suffix", "not supported"});
  expect_parts(error_loading({with_model(R"(["a b"])", R"("dropout": 0.1, )")}),
               {"model.dropout", "not supported"});
}

// ignore_merges: a piece that is a vocabulary token as a whole is that token, even when the
// merges would not build it ("abc" here: there is no merge "ab c").
TEST(TokenizerJson, IgnoreMergesTakesWholePiecesFromTheVocabulary) {
  json vocab = json::parse(small_vocab());
  vocab["abc"] = 257;
  auto load = [&](bool ignore_merges) {
    TokenizerFiles f;
    f.origin = "mem";
    const std::string text = json{
        {"model",
         {{"type", "BPE"},
          {"ignore_merges", ignore_merges},
          {"vocab", vocab},
          {"merges", {"a b"}}}}}.dump();
    f.tokenizer_json = text;
    return Tokenizer(f);
  };
  EXPECT_EQ(load(false).encode("abc abcd"), (Ids{256, 'c', ' ', 256, 'c', 'd'}));
  EXPECT_EQ(load(true).encode("abc abcd"), (Ids{257, ' ', 256, 'c', 'd'}));
}

// The pipeline around the model: what is not null/NFC, Split + ByteLevel or ByteLevel.
TEST(TokenizerJsonErrors, PipelineThatIsNotSupported) {
  auto with = [](const std::string& part) {
    return R"({"version": "1.0", )" + part + R"(, "model": {"type": "BPE", "vocab": )" +
           small_vocab() + R"(, "merges": ["a b"]}})";
  };
  auto pre = [&](const std::string& split, const std::string& byte_level) {
    return with(R"("pre_tokenizer": {"type": "Sequence", "pretokenizers": [)" + split + ", " +
                byte_level + "]}");
  };
  const std::string split = R"({"type": "Split", "pattern": {"Regex": "\\p{L}+"},
                                "behavior": "Isolated", "invert": false})";
  const std::string byte_level =
      R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})";
  // The base: loads, splits letters from the rest, and does not normalise.
  const fs::path dir = testing::temp_dir("tokenizer-json-pipeline");
  testing::write_text(dir / "tokenizer.json",
                      pre(split, byte_level).insert(1, R"("normalizer": null, )"));
  EXPECT_EQ(Tokenizer::from_directory(dir).encode("ab1"), (Ids{256, '1'}));

  expect_parts(error_loading({with(R"("normalizer": {"type": "Lowercase"})")}),
               {"normalizer", "Lowercase", "not supported", "null or NFC"});
  expect_parts(error_loading({with(R"("decoder": {"type": "Metaspace"})")}),
               {"decoder", "Metaspace", "not supported"});
  expect_parts(error_loading({with(R"("pre_tokenizer": {"type": "Whitespace"})")}),
               {"pre_tokenizer", "Whitespace", "not supported"});
  expect_parts(error_loading({with(R"("pre_tokenizer": null)")}),
               {"pre_tokenizer", "not supported"});
  expect_parts(error_loading({pre(byte_level, split)}),
               {"pre_tokenizer.pretokenizers[0]", "not supported"});
  expect_parts(error_loading({pre(R"({"type": "Split", "pattern": {"String": " "},
                                      "behavior": "Isolated"})",
                                  byte_level)}),
               {"pretokenizers[0].pattern", "String", "not supported"});
  expect_parts(error_loading({pre(R"({"type": "Split", "pattern": {"Regex": "a"},
                                      "behavior": "Removed"})",
                                  byte_level)}),
               {"pretokenizers[0].behavior", "Removed", "Isolated"});
  expect_parts(error_loading({pre(R"({"type": "Split", "pattern": {"Regex": "a"},
                                      "behavior": "Isolated", "invert": true})",
                                  byte_level)}),
               {"pretokenizers[0].invert", "only false"});
  expect_parts(error_loading({pre(split, R"({"type": "ByteLevel", "add_prefix_space": true})")}),
               {"pretokenizers[1].add_prefix_space", "only false"});
  expect_parts(error_loading({pre(split, R"({"type": "ByteLevel", "use_regex": true})")}),
               {"pretokenizers[1].use_regex", "only false"});
  // A pattern with a construct the translation does not take: its place and what it is.
  expect_parts(error_loading({pre(R"({"type": "Split", "pattern": {"Regex": "\\w+|\\s"},
                                      "behavior": "Isolated"})",
                                  byte_level)}),
               {"pretokenizers[0].pattern.Regex", "\\w", "offset 0", "not supported"});
  expect_parts(error_loading({pre(R"({"type": "Split", "pattern": {"Regex": "a{3,1}"},
                                      "behavior": "Isolated"})",
                                  byte_level)}),
               {"pretokenizers[0].pattern.Regex", "does not compile"});
}

TEST(TokenizerJsonErrors, MergesThatAreNotMerges) {
  expect_parts(error_loading({with_model("[42]")}),
               {"model.merges[0]", "expected a merge", "found a number"});
  expect_parts(error_loading({with_model(R"(["a b", null])")}),
               {"model.merges[1]", "expected a merge", "found null"});
  expect_parts(error_loading({with_model(R"(["a b", true])")}),
               {"model.merges[1]", "found a boolean"});
  expect_parts(error_loading({with_model(R"([["a", 7]])")}),
               {"model.merges[0][1]", "merge symbol", "found a number"});
  expect_parts(error_loading({with_model(R"([["a", ["b"]]])")}),
               {"model.merges[0][1]", "unexpected array"});
  expect_parts(error_loading({with_model(R"([["a"]])")}), {"model.merges[0]", "two parts"});
  expect_parts(error_loading({with_model(R"([{"a": "b"}])")}),
               {"model.merges[0]", "unexpected object"});
  expect_parts(error_loading({with_model(R"(["ab"])")}), {"model.merges[0]", "two symbols"});
  expect_parts(error_loading({with_model(R"(["a q"])")}),
               {"model.merges[0]", "\"aq\"", "not in the vocabulary"});
}

TEST(TokenizerJsonErrors, IdsOutOfRangeOrTwice) {
  auto vocab_with = [](const std::string& entry) {
    std::string v = small_vocab();
    v.insert(v.size() - 1, "," + entry);
    return R"({"model": {"type": "BPE", "vocab": )" + v + R"(, "merges": ["a b"]}})";
  };
  expect_parts(error_loading({vocab_with(R"("xy": 4294967296)")}),
               {"model.vocab.xy", "4294967296", "out of range"});
  expect_parts(error_loading({vocab_with(R"("xy": -1)")}), {"model.vocab.xy", "negative"});
  expect_parts(error_loading({vocab_with(R"("xy": 2.5)")}), {"model.vocab.xy", "token id"});
  expect_parts(error_loading({vocab_with(R"("xy": "7")")}), {"model.vocab.xy", "token id"});
  expect_parts(error_loading({vocab_with(R"("xy": 256)")}),
               {"model.vocab.xy", "id 256", "another token"});

  auto added = [](const std::string& list) { return with_model(R"(["a b"])", "", list); };
  expect_parts(error_loading({added(R"([{"id": 16777216, "content": "<x>"}])")}),
               {"added_tokens[0].id", "out of range"});
  expect_parts(error_loading({added(R"([{"id": "300", "content": "<x>"}])")}),
               {"added_tokens[0].id", "token id"});
  expect_parts(error_loading({added(R"([{"content": "<x>"}])")}),
               {"added_tokens[0]", "missing \"id\""});
  expect_parts(error_loading({added(R"([{"id": 300, "content": 5}])")}),
               {"added_tokens[0]", "\"content\" must be a string"});
  expect_parts(error_loading({added(R"([5])")}), {"added_tokens[0]", "expected an added token"});
  expect_parts(
      error_loading({added(R"([{"id": 300, "content": "<x>"}, {"id": 300, "content": "<y>"}])")}),
      {"added_tokens[1]", "id 300", "\"<y>\"", "\"<x>\""});
  expect_parts(
      error_loading({added(R"([{"id": 300, "content": "<x>"}, {"id": 301, "content": "<x>"}])")}),
      {"added_tokens[1]", "\"<x>\"", "two ids"});
  // An id the vocabulary already gives to another token ("ab" is 256).
  expect_parts(error_loading({added(R"([{"id": 256, "content": "<x>"}])")}),
               {"added_tokens[0]", "id 256", "\"<x>\"", "\"ab\""});
}

// The two files disagree, or the one beside tokenizer.json is broken: the message names
// tokenizer_config.json.
TEST(TokenizerJsonErrors, TokenizerConfigAlongside) {
  const std::string fast =
      with_model(R"(["a b"])", "", R"([{"id": 300, "content": "<x>", "special": true}])");
  expect_parts(error_loading({fast, R"({"added_tokens_decoder": {"300": {"content": "<y>"}}})"},
                             "tokenizer_config.json"),
               {"added_tokens_decoder[\"300\"]", "\"<y>\"", "\"<x>\""});
  expect_parts(error_loading({fast, "{ nope"}, "tokenizer_config.json"), {"not valid JSON"});
  // Agreeing files are fine, and tokenizer_config.json may add tokens of its own.
  const fs::path dir = testing::temp_dir("tokenizer-json-with-config");
  testing::write_text(dir / "tokenizer.json", fast);
  testing::write_text(dir / "tokenizer_config.json", R"({"added_tokens_decoder": {
      "300": {"content": "<x>", "special": true}, "301": {"content": "<z>"}}})");
  const Tokenizer t = Tokenizer::from_directory(dir);
  EXPECT_EQ(t.encode("<z>a<x>"), (Ids{301, 'a', 300}));
}

// The real fixture cut short, or with a byte that is not UTF-8: an error naming the file.
TEST(TokenizerJsonErrors, DamagedFixture) {
  const std::string text = read_text_file(fixture("merge-pairs"));
  expect_parts(error_loading({text.substr(0, text.size() / 2)}), {"not valid JSON"});
  std::string bad = text;
  bad[bad.find("\"Ġt\"") + 1] = '\xFF';
  expect_parts(error_loading({bad}), {"not valid JSON"});
}

}  // namespace
}  // namespace klein
