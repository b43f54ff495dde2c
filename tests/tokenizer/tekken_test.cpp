// A Tekken-style tokenizer.json (FLUX.2-dev's Mistral-Small-3.1 tokenizer as transformers'
// converter writes it: no normaliser, the file's own Split pattern, ignore_merges) against the
// ids of the official JavaScript implementation of tokenizer.json, and the translation of
// Split patterns from Oniguruma's syntax to PCRE2's.
//
// The tokenizer is the small one of tests/data/flux2-dev-tiny/model/tokenizer and the ids are
// in tests/data/flux2-dev-tiny/tokenizer_vectors.json, both made by
// tools/refgen/tekken_tokenizer.py (the set's README says how).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string_view>

#include "core/files.h"
#include "families/flux2_dev/prompt.h"
#include "support/testing.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
namespace fs = std::filesystem;

using testing::dev_set;

const Tokenizer& tekken() {
  static const Tokenizer tokenizer = Tokenizer::from_directory(dev_set() / "model" / "tokenizer");
  return tokenizer;
}

const json& vectors() {
  static const json v = json::parse(read_text_file(dev_set() / "tokenizer_vectors.json"));
  return v;
}

TEST(Tekken, LoadsTheConvertedLayout) {
  const Tokenizer& t = tekken();
  EXPECT_EQ(t.vocab_size(), vectors()["vocab_size"].get<size_t>());  // 8192, controls included
  EXPECT_EQ(t.merge_count(), vectors()["merges"].get<size_t>());
  ASSERT_EQ(t.added_tokens().size(), 1000u);
  // Mistral's control tokens at their ids.
  EXPECT_EQ(t.token_id("<unk>"), 0);
  EXPECT_EQ(t.token_id("<s>"), 1);
  EXPECT_EQ(t.token_id("</s>"), 2);
  EXPECT_EQ(t.token_id("[INST]"), 3);
  EXPECT_EQ(t.token_id("[/INST]"), 4);
  EXPECT_EQ(t.token_id("[IMG]"), 10);
  EXPECT_EQ(t.token_id("<pad>"), 11);
  EXPECT_EQ(t.token_id("[SYSTEM_PROMPT]"), 17);
  EXPECT_EQ(t.token_id("[/SYSTEM_PROMPT]"), 18);
  EXPECT_EQ(t.token_id("<SPECIAL_999>"), 999);
  for (const AddedToken& a : t.added_tokens()) EXPECT_TRUE(a.special) << a.content;
  // The 256 bytes follow them.
  EXPECT_EQ(t.token(1000), std::string("Ā"));  // byte 0
  EXPECT_EQ(t.token(1000 + 'a'), "a");
}

// Every reference string: ids, tokens and decoded text as the reference, and the text back.
TEST(Tekken, MatchesEveryReferenceString) {
  const json& cases = vectors()["strings"];
  ASSERT_GE(cases.size(), 60u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const json& c = cases[i];
    const std::string text = c["text"];
    SCOPED_TRACE("strings[" + std::to_string(i) + "]");
    const Ids ids = tekken().encode(text);
    EXPECT_EQ(ids, c["ids"].get<Ids>());
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(tekken().token(id));
    EXPECT_EQ(tokens, c["tokens"].get<std::vector<std::string>>());
    EXPECT_EQ(tekken().decode(ids), c["decoded"].get<std::string>());
    EXPECT_EQ(tekken().decode(ids), text);
  }
}

// The FLUX.2-dev pipeline's prompts, rendered by the official chat template: the same ids.
TEST(Tekken, MatchesTheRenderedChatPrompts) {
  const json& prompts = vectors()["prompts"];
  ASSERT_GE(prompts.size(), 4u);
  for (const json& p : prompts) {
    const std::string rendered = p["rendered"];
    SCOPED_TRACE(p["prompt"].dump(-1, ' ', false, json::error_handler_t::replace));
    ASSERT_TRUE(rendered.starts_with("<s>[SYSTEM_PROMPT]"));
    const Ids ids = tekken().encode(rendered);
    EXPECT_EQ(ids, p["ids"].get<Ids>());
    EXPECT_EQ(tekken().decode(ids), rendered);
  }
}

// The engine's FLUX.2-dev prompt: the chat text the official template renders, its ids, then
// <pad> on the side tokenizer_config.json names (left here) up to 512.
TEST(Tekken, DevPromptIsTheRenderedChatPadded) {
  ASSERT_TRUE(tekken().pads_left());
  for (const json& p : vectors()["prompts"]) {
    const std::string prompt = p["prompt"];
    SCOPED_TRACE(p["prompt"].dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_EQ(dev_chat_text(prompt), p["rendered"].get<std::string>());
    const Ids want = p["ids"].get<Ids>();
    const PromptTokens got = tokenize_dev_prompt(tekken(), prompt);
    ASSERT_EQ(got.ids.size(), 512u);
    const size_t pad = 512 - want.size();
    EXPECT_EQ(Ids(got.ids.begin(), got.ids.begin() + long(pad)), Ids(pad, 11));
    EXPECT_EQ(Ids(got.ids.begin() + long(pad), got.ids.end()), want);
    EXPECT_EQ(got.real_tokens, int(want.size()));
    EXPECT_EQ(got.pad_id, 11);
  }
}

// padding_side is read from tokenizer_config.json: right when absent, and a value other than
// left or right is refused naming the file.
TEST(Tekken, PaddingSideComesFromTheConfig) {
  const fs::path dir = testing::temp_dir("tekken-padding");
  fs::copy_file(dev_set() / "model" / "tokenizer" / "tokenizer.json", dir / "tokenizer.json");
  testing::write_text(dir / "tokenizer_config.json", R"({"padding_side": "right"})");
  EXPECT_FALSE(Tokenizer::from_directory(dir).pads_left());
  testing::write_text(dir / "tokenizer_config.json", "{}");
  EXPECT_FALSE(Tokenizer::from_directory(dir).pads_left());
  testing::write_text(dir / "tokenizer_config.json", R"({"padding_side": "middle"})");
  const std::string e = testing::error_of([&] { Tokenizer::from_directory(dir); });
  EXPECT_NE(e.find("tokenizer_config.json: padding_side must be \"left\" or \"right\""),
            std::string::npos) << e;
}

TEST(Tekken, TokenizerConfigHasTheChatTemplate) {
  const json config =
      json::parse(read_text_file(dev_set() / "model" / "tokenizer" / "tokenizer_config.json"));
  EXPECT_EQ(config["bos_token"], "<s>");
  EXPECT_EQ(config["pad_token"], "<pad>");
  EXPECT_TRUE(config["chat_template"].get<std::string>().find("[SYSTEM_PROMPT]") !=
              std::string::npos);
}

// No normaliser: text in another normal form keeps its own ids (Qwen's NFC would compose it).
TEST(Tekken, DoesNotNormalise) {
  const std::string decomposed = "cafe\xCC\x81";  // e + U+0301
  const std::string composed = "caf\xC3\xA9";
  EXPECT_NE(tekken().encode(decomposed), tekken().encode(composed));
  EXPECT_EQ(tekken().decode(tekken().encode(decomposed)), decomposed);
}

// ---------------------------------------------------------------------------------------
// Split patterns

std::vector<std::string> pieces(std::string_view pattern, std::string_view text) {
  return tok::Pretokenizer(pattern, "test").split(text);
}

using Pieces = std::vector<std::string>;

TEST(SplitPattern, QwenPatternIsTheBuiltInSpelling) {
  // \s and \S written out as the White_Space property; the rest as it is.
  const std::string ws =
      "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  EXPECT_EQ(tok::translate_split_pattern(tok::kQwen2Pattern, "qwen"),
            "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^" + ws +
                "\\p{L}\\p{N}]+[\\r\\n]*|[" + ws + "]*[\\r\\n]+|[" + ws + "]+(?![^" + ws + "])|[" +
                ws + "]+");
}

TEST(SplitPattern, IsolatedKeepsTheTextBetweenMatches) {
  EXPECT_EQ(pieces("\\p{N}+", "ab12cd3"), (Pieces{"ab", "12", "cd", "3"}));
  EXPECT_EQ(pieces("\\p{N}{1,3}", "1234567"), (Pieces{"123", "456", "7"}));
  EXPECT_EQ(pieces("\\p{N}{,2}", "123"), (Pieces{"12", "3"}));
  EXPECT_EQ(pieces("x", "abc"), (Pieces{"abc"}));
  // Empty matches split the text between them, one character at a time after the first
  // (Oniguruma's find_iter skips an empty match where the last match ended).
  EXPECT_EQ(pieces("x*", "ab\xC3\xA9"), (Pieces{"a", "b", "\xC3\xA9"}));
  EXPECT_EQ(pieces("b*", "abba"), (Pieces{"a", "bb", "a"}));
}

TEST(SplitPattern, OnigurumaMeaningsArePreserved) {
  // \s is White_Space, U+0085 included; "." stops at \n only; \v is one character.
  EXPECT_EQ(pieces("\\s+", "a\xC2\x85 b"), (Pieces{"a", "\xC2\x85 ", "b"}));
  EXPECT_EQ(pieces("a.b", "a\nb a\rb"), (Pieces{"a\nb ", "a\rb"}));
  EXPECT_EQ(pieces("\\v+", "a\x0B\n"), (Pieces{"a", "\x0B", "\n"}));
  EXPECT_EQ(pieces("[\\s]", "a\xC2\x85"), (Pieces{"a", "\xC2\x85"}));
  EXPECT_EQ(pieces("(?i:'s)", "it'S"), (Pieces{"it", "'S"}));
  // Unicode case folding: U+017F LATIN SMALL LETTER LONG S folds to "s" (as in Oniguruma).
  EXPECT_EQ(pieces("(?i:'s)", "it'\xC5\xBF"), (Pieces{"it", "'\xC5\xBF"}));
  EXPECT_EQ(pieces("\\u00e9|\\x{1F600}|\\x41",
                   "\xC3\xA9\xF0\x9F\x98\x80"
                   "A"),
            (Pieces{"\xC3\xA9", "\xF0\x9F\x98\x80", "A"}));
  EXPECT_EQ(pieces("[\\p{Lu}\\p{^L}]+", "abCD1e"), (Pieces{"ab", "CD1", "e"}));
  EXPECT_EQ(pieces("a]}", "xa]}"), (Pieces{"x", "a]}"}));
}

// Patterns of the same family (letters split by case class, digits one by one, "/" kept
// with the symbols before a line break) translate and compile.
TEST(SplitPattern, CaseClassPatternsCompile) {
  const std::string_view pattern =
      R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
      R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  EXPECT_EQ(pieces(pattern, "HelloWorld 2024 a/b\n"),
            (Pieces{"Hello", "World", " ", "2", "0", "2", "4", " a", "/b", "\n"}));
  // It is Mistral's Tekken pattern, which a GGUF names "tekken" (tokenizer/tekken.h).
  EXPECT_EQ(std::string_view(kTekkenPattern), pattern);
}

TEST(SplitPattern, UnsupportedConstructsAreRefused) {
  auto refused = [](std::string_view pattern, std::initializer_list<std::string_view> parts) {
    const std::string message =
        testing::error_of([&] { tok::translate_split_pattern(pattern, "where.Regex"); });
    EXPECT_TRUE(message.starts_with("where.Regex: ")) << message;
    EXPECT_NE(message.find("not supported"), std::string::npos) << message;
    for (std::string_view p : parts)
      EXPECT_NE(message.find(p), std::string::npos) << "\"" << message << "\" lacks " << p;
  };
  refused("\\w+", {"\\w", "offset 0"});
  refused("a\\b", {"\\b", "offset 1"});
  refused("^a", {"anchor"});
  refused("a$", {"anchor"});
  refused("(a)\\1", {"\\1"});
  refused("(?<n>a)", {"group"});
  refused("(?>a)", {"group"});
  refused("(?i)a", {"group"});
  refused("[[:alpha:]]", {"inside a class"});
  refused("[a-z&&[^aeiou]]", {"intersection"});
  refused("[a&&b]", {"intersection"});
  refused("\\p{Greek}", {"Greek"});
  refused("a{2}+", {"after an interval"});
  refused("a{x}", {"not an interval"});
  refused("+a", {"nothing before"});
  refused("a**", {"quantifier after a quantifier"});
  refused("(a", {"never closed"});
  refused("a)", {"unmatched"});
  refused("[ab", {"never closed"});
  refused("[\\S]", {"\\S"});
  refused("\\x{zz}", {"code point"});
  refused("a\\", {"end"});
}

// ---------------------------------------------------------------------------------------
// Mistral's own file, tekken.json (tokenizer/tekken.h). tools/tekken/tekken_json.py writes
// the tokenizer above as Mistral's file (the converter undone, plus vocab entries beyond the
// vocabulary that must not be used); read back, it must be the converter's tokenizer.json
// (which tools/refgen/tekken_tokenizer.py wrote) and give the official ids.

const std::string& tekken_json_text() {
  static const std::string text = [] {
    const fs::path out = testing::temp_dir("tekken-json") / "tekken.json";
    const std::string cmd =
        "/usr/bin/python3 " +
        testing::shell_arg(fs::path(KLEIN_SOURCE_DIR) / "tools" / "tekken" / "tekken_json.py") +
        " " + testing::shell_arg(dev_set() / "model" / "tokenizer" / "tokenizer.json") + " " +
        testing::shell_arg(out);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error(cmd + " failed");
    return read_text_file(out);
  }();
  return text;
}

TEST(TekkenJson, BecomesTheConvertersTokenizerJson) {
  const TokenizerBytes b = tekken_tokenizer(tekken_json_text(), "tekken.json");
  ASSERT_TRUE(b.tokenizer_json);
  const json got = json::parse(*b.tokenizer_json);
  const json want =
      json::parse(read_text_file(dev_set() / "model" / "tokenizer" / "tokenizer.json"));
  EXPECT_EQ(got["model"]["vocab"].size(), 8192u);
  EXPECT_EQ(got["model"]["vocab"], want["model"]["vocab"]);
  ASSERT_EQ(got["model"]["merges"].size(), want["model"]["merges"].size());
  EXPECT_EQ(got["model"]["merges"], want["model"]["merges"]);
  EXPECT_EQ(got["model"]["ignore_merges"], true);
  EXPECT_EQ(got["added_tokens"], want["added_tokens"]);
  EXPECT_EQ(got["pre_tokenizer"]["pretokenizers"][0], want["pre_tokenizer"]["pretokenizers"][0]);
  EXPECT_EQ(got["normalizer"], want["normalizer"]);
}

TEST(TekkenJson, GivesTheOfficialIds) {
  const Tokenizer t(tekken_tokenizer(tekken_json_text(), "tekken.json").files());
  EXPECT_EQ(t.vocab_size(), vectors()["vocab_size"].get<size_t>());
  EXPECT_TRUE(t.pads_left());
  for (const json& c : vectors()["strings"]) {
    SCOPED_TRACE(c["text"].dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_EQ(t.encode(c["text"].get<std::string>()), c["ids"].get<Ids>());
  }
  for (const json& p : vectors()["prompts"]) {
    SCOPED_TRACE(p["prompt"].dump(-1, ' ', false, json::error_handler_t::replace));
    EXPECT_EQ(t.encode(p["rendered"].get<std::string>()), p["ids"].get<Ids>());
    const PromptTokens got = tokenize_dev_prompt(t, p["prompt"].get<std::string>());
    const PromptTokens want = tokenize_dev_prompt(tekken(), p["prompt"].get<std::string>());
    EXPECT_EQ(got.ids, want.ids);
  }
}

// Broken files are refused naming the file and what is wrong.
TEST(TekkenJson, BrokenFilesAreNamed) {
  const json good = json::parse(tekken_json_text());
  auto error_with = [&](const std::function<void(json&)>& change) {
    json j = good;
    change(j);
    return testing::error_of([&] { tekken_tokenizer(j.dump(), "te.safetensors: tensor tekken_model"); });
  };
  auto expect_error = [](const std::string& e, const std::string& part) {
    EXPECT_NE(e.find("te.safetensors: tensor tekken_model"), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  };
  expect_error(testing::error_of([] { tekken_tokenizer("{\"config\": ", "te.safetensors: tensor tekken_model"); }),
               "does not parse");
  expect_error(error_with([](json& j) { j.erase("vocab"); }), "expected an object with \"config\" and \"vocab\"");
  expect_error(error_with([](json& j) { j["config"].erase("pattern"); }), "config.pattern");
  expect_error(error_with([](json& j) { j["config"]["default_vocab_size"] = -3; }),
               "config.default_vocab_size must be a positive integer");
  expect_error(error_with([](json& j) { j["config"]["default_vocab_size"] = 900; }),
               "leaves no room after 1000 special tokens");
  expect_error(error_with([](json& j) { j["config"]["default_vocab_size"] = 9000; }),
               "needs 8000");
  expect_error(error_with([](json& j) { j.erase("special_tokens"); }), "no special_tokens list");
  expect_error(error_with([](json& j) { j["special_tokens"][3]["rank"] = 1000; }),
               "rank 1000 is outside the 1000 special ids");
  expect_error(error_with([](json& j) { j["vocab"][5]["rank"] = 6; }), "vocab[5]: expected rank 5");
  expect_error(error_with([](json& j) { j["vocab"][7]["token_bytes"] = "not base64!"; }),
               "vocab[7]: token_bytes is not base64");
  expect_error(error_with([](json& j) { j["vocab"][300]["token_bytes"] = j["vocab"][97]["token_bytes"]; }),
               "vocab[300] repeats the bytes of vocab[97]");
  expect_error(error_with([](json& j) {
                 j["special_tokens"][20]["token_str"] = "a";
               }),
               "is spelled like special token 20");
  // Tokens read from elsewhere (a GGUF's metadata) may be any bytes; JSON cannot carry them.
  TekkenLayout layout;
  layout.vocab = {"a", "b", "\xff\xfe"};
  layout.pattern = kTekkenPattern;
  expect_error(testing::error_of([&] {
                 tekken_layout_files(layout, "te.safetensors: tensor tekken_model");
               }),
               "a token is not UTF-8 text");
}

}  // namespace
}  // namespace klein
