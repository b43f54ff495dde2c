// Loading from memory and from files: both file layouts, merge priority on a hand-made
// vocabulary, and the errors a broken file must produce.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <initializer_list>
#include <random>
#include <string_view>

#include "core/error.h"
#include "core/files.h"
#include "support/testing.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using Parts = std::initializer_list<std::string_view>;  // pieces an error message must contain
namespace fs = std::filesystem;

// A minimal byte-level vocabulary: the 256 single bytes (id = byte value) and then `extra`
// tokens (given as raw text) from id 256 on.
std::string small_vocab_json(const std::vector<std::string>& extra) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[tok::bytes_to_symbols(std::string(1, char(b)))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[tok::bytes_to_symbols(extra[i])] = 256 + i;
  return vocab.dump();
}

// Merges given as raw-text pairs, written in the merges.txt form.
std::string small_merges_txt(const std::vector<std::pair<std::string, std::string>>& merges) {
  std::string text = "#version: 0.2\n";
  for (const auto& [a, b] : merges)
    text += tok::bytes_to_symbols(a) + " " + tok::bytes_to_symbols(b) + "\n";
  return text;
}

TokenizerFiles files_of(const std::string& vocab, const std::string& merges) {
  TokenizerFiles f;
  f.origin = "mem";
  f.vocab_json = vocab;
  f.merges_txt = merges;
  return f;
}

// Expects a klein::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, Parts parts) {
  try {
    f();
    ADD_FAILURE() << "expected klein::Error";
  } catch (const Error& e) {
    for (std::string_view p : parts)
      EXPECT_NE(std::string_view(e.what()).find(p), std::string_view::npos)
          << "message \"" << e.what() << "\" lacks \"" << p << "\"";
  }
}

TEST(BpeMerges, LowestRankWinsNotLeftmost) {
  // "b c" has the better rank, so "abc" becomes "a" + "bc" although "a b" comes first.
  const std::string vocab = small_vocab_json({"bc", "ab"});
  const std::string merges = small_merges_txt({{"b", "c"}, {"a", "b"}});
  const Tokenizer t(files_of(vocab, merges));
  EXPECT_EQ(t.encode("abc"), (Ids{'a', 256}));
  EXPECT_EQ(t.encode("abd"), (Ids{257, 'd'}));
}

TEST(BpeMerges, OverlappingPairsMergeLeftToRight) {
  const Tokenizer t(
      files_of(small_vocab_json({"aa", "aaaa"}), small_merges_txt({{"a", "a"}, {"aa", "aa"}})));
  EXPECT_EQ(t.encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t.encode("aaaaa"), (Ids{257, 'a'}));
  EXPECT_EQ(t.encode("aaaaaa"), (Ids{257, 256}));
}

TEST(BpeMerges, ChainsOfMergesBuildLongTokens) {
  const Tokenizer t(
      files_of(small_vocab_json({"he", "ll", "hell", "hello"}),
               small_merges_txt({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}})));
  EXPECT_EQ(t.encode("hello"), (Ids{259}));
  EXPECT_EQ(t.encode("hellhello"), (Ids{258, 259}));  // one piece: letters only
  EXPECT_EQ(t.decode(Ids{258, 259}), "hellhello");
  EXPECT_EQ(t.token(259), "hello");
  EXPECT_EQ(t.token(' '), "\xC4\xA0");  // "Ġ"
}

TEST(Loading, AddedTokensFromConfigSplitTheText) {
  const std::string vocab = small_vocab_json({"xy"});
  const std::string merges = small_merges_txt({{"x", "y"}});
  const std::string config = R"({"added_tokens_decoder": {
      "300": {"content": "<a>", "special": true},
      "301": {"content": "<ab>", "special": false}}})";
  TokenizerFiles f = files_of(vocab, merges);
  f.tokenizer_config_json = config;
  const Tokenizer t(f);
  EXPECT_EQ(t.encode("q<ab>r<a>"), (Ids{'q', 301, 'r', 300}));  // longest match wins
  EXPECT_EQ(t.encode("<a<ab>"), (Ids{'<', 'a', 301}));
  EXPECT_EQ(t.decode(Ids{'q', 300, 301}, /*skip_special=*/true), "q<ab>");
}

// The same vocabulary as tokenizer.json, with merges in both spellings: identical ids.
TEST(Loading, TokenizerJsonMatchesVocabAndMerges) {
  const fs::path dir = testing::tiny_model() / "tokenizer";
  const std::string vocab = read_text_file(dir / "vocab.json");
  const std::string merges = read_text_file(dir / "merges.txt");
  const json config = json::parse(read_text_file(dir / "tokenizer_config.json"));
  json added = json::array();
  for (auto& [id, t] : config["added_tokens_decoder"].items())
    added.push_back({{"id", std::stoi(id)},
                     {"content", t["content"]},
                     {"special", t["special"]},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false},
                     {"normalized", false}});

  auto tokenizer_json = [&](bool pairs) {
    std::string m = "[";
    size_t line_start = 0;
    bool first = true;
    for (size_t eol; (eol = merges.find('\n', line_start)) != std::string::npos;
         line_start = eol + 1) {
      std::string line = merges.substr(line_start, eol - line_start);
      if (line.empty() || line.starts_with("#version")) continue;
      const size_t space = line.find(' ');
      m += first ? "" : ",";
      first = false;
      m += pairs ? json::array({line.substr(0, space), line.substr(space + 1)}).dump()
                 : json(line).dump();
    }
    m += "]";
    return R"({"version": "1.0", "added_tokens": )" + added.dump() +
           R"(, "normalizer": {"type": "NFC"}, "model": {"type": "BPE", "vocab": )" + vocab +
           R"(, "merges": )" + m + "}}";
  };

  const Tokenizer reference = Tokenizer::from_directory(dir);
  const json cases =
      json::parse(read_text_file(testing::tiny_vectors() / "tokenizer" / "strings.json"))["cases"];
  for (bool pairs : {false, true}) {
    const std::string text = tokenizer_json(pairs);
    TokenizerFiles f;
    f.origin = "mem";
    f.tokenizer_json = text;
    const Tokenizer t(f);
    EXPECT_EQ(t.vocab_size(), reference.vocab_size());
    EXPECT_EQ(t.merge_count(), reference.merge_count());
    EXPECT_EQ(t.added_tokens().size(), 26u);
    for (const json& c : cases)
      EXPECT_EQ(t.encode(c["text"].get<std::string>()), c["ids"].get<Ids>());
  }
}

TEST(Loading, DirectoryWithTokenizerJsonIgnoresTheOtherFiles) {
  const fs::path dir = testing::temp_dir("tokenizer_json_dir");
  const std::string vocab = small_vocab_json({"ab"});
  std::ofstream(dir / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": )" << vocab << R"(, "merges": [["a", "b"]]}})";
  std::ofstream(dir / "vocab.json") << "not even JSON";
  const Tokenizer t = Tokenizer::from_directory(dir);
  EXPECT_EQ(t.encode("abab"), (Ids{256, 256}));
}

TEST(LoadingErrors, MissingDirectoryOrFiles) {
  expect_error([] { Tokenizer::from_directory("/nonexistent/klein/tokenizer"); },
               {"/nonexistent/klein/tokenizer", "does not exist"});
  const fs::path dir = testing::temp_dir("tokenizer_missing");
  { std::ofstream(dir / "merges.txt") << "#version: 0.2\n"; }
  expect_error([&] { Tokenizer::from_directory(dir); }, {"vocab.json", "missing"});
  TokenizerFiles f;
  f.origin = "mem";
  f.vocab_json = "{}";
  expect_error([&] { Tokenizer t(f); }, {"merges.txt", "missing"});
}

TEST(LoadingErrors, CorruptMergesTxt) {
  const std::string vocab = small_vocab_json({"ab"});
  // Line 3 has three fields.
  expect_error([&] { Tokenizer t(files_of(vocab, "#version: 0.2\na b\na b c\n")); },
               {"mem/merges.txt", "line 3", "two symbols"});
  // A merge whose result is not in the vocabulary.
  expect_error([&] { Tokenizer t(files_of(vocab, "#version: 0.2\na b\nb c\n")); },
               {"mem/merges.txt", "line 3", "\"bc\"", "not in the vocabulary"});
  // A symbol that is not in the vocabulary at all.
  expect_error([&] { Tokenizer t(files_of(vocab, "ab zz\n")); }, {"line 1", "\"zz\""});
  // A character outside the byte-level alphabet (U+4E2D).
  expect_error([&] { Tokenizer t(files_of(vocab, "a \xE4\xB8\xAD\n")); },
               {"line 1", "byte alphabet"});
  // Nothing but the header.
  expect_error([&] { Tokenizer t(files_of(vocab, "#version: 0.2\n")); },
               {"merges.txt", "no merges"});
  // Binary garbage.
  expect_error([&] { Tokenizer t(files_of(vocab, std::string("\x00\xff\xfe garbage\n", 13))); },
               {"merges.txt", "line 1"});
}

TEST(LoadingErrors, CorruptVocabJson) {
  const std::string merges = small_merges_txt({{"a", "b"}});
  expect_error([&] { Tokenizer t(files_of("{\"a\": 1,", merges)); },
               {"mem/vocab.json", "not valid JSON"});
  expect_error([&] { Tokenizer t(files_of("[1, 2]", merges)); },
               {"vocab.json", "expected a JSON object"});
  expect_error([&] { Tokenizer t(files_of(R"({"a": "one"})", merges)); },
               {"vocab.json", "\"a\"", "expected a token id"});
  expect_error([&] { Tokenizer t(files_of(R"({"a": -4})", merges)); }, {"vocab.json", "negative"});
  expect_error([&] { Tokenizer t(files_of(R"({"a": 99999999999})", merges)); }, {"out of range"});
  expect_error([&] { Tokenizer t(files_of(R"({"a": 1, "b": 1})", merges)); }, {"\"b\"", "id 1"});
  expect_error([&] { Tokenizer t(files_of(R"({"a": 0})", merges)); }, {"vocab.json", "byte"});
  expect_error([&] { Tokenizer t(files_of(R"({"a b": 0})", merges)); }, {"byte alphabet"});
  expect_error([&] { Tokenizer t(files_of("{}", merges)); }, {"vocab.json", "empty"});
}

TEST(LoadingErrors, CorruptAddedTokens) {
  const std::string vocab = small_vocab_json({"ab"});
  const std::string merges = small_merges_txt({{"a", "b"}});
  auto config_error = [&](const std::string& decoder, Parts parts) {
    TokenizerFiles f = files_of(vocab, merges);
    const std::string config = R"({"added_tokens_decoder": )" + decoder + "}";
    f.tokenizer_config_json = config;
    expect_error([&] { Tokenizer t(f); }, parts);
  };
  config_error(R"({"x1": {"content": "<a>"}})", {"mem/tokenizer_config.json", "x1", "token id"});
  config_error(R"({"300": {"special": true}})", {"tokenizer_config.json", "300", "content"});
  config_error(R"({"300": {"content": "<a>", "lstrip": true}})", {"lstrip"});
  config_error(R"({"300": {"content": "<a>"}, "301": {"content": "<a>"}})", {"two ids"});
  config_error(R"({"300": {"content": "<a>", "special": "yes"}})", {"special", "true or false"});
  config_error(R"([1, 2])", {"added_tokens_decoder", "object"});

  TokenizerFiles f = files_of(vocab, merges);
  f.tokenizer_config_json = "{ nope";
  expect_error([&] { Tokenizer t(f); }, {"tokenizer_config.json", "not valid JSON"});
}

TEST(LoadingErrors, CorruptTokenizerJson) {
  const std::string vocab = small_vocab_json({"ab"});
  auto json_error = [](const std::string& text, Parts parts) {
    TokenizerFiles f;
    f.origin = "mem";
    f.tokenizer_json = text;
    expect_error([&] { Tokenizer t(f); }, parts);
  };
  // Everything after "model": {"type": "BPE", "vocab": <vocab>.
  auto model_error = [&](const std::string& rest, Parts parts) {
    json_error(R"({"model": {"type": "BPE", "vocab": )" + vocab + rest, parts);
  };
  json_error(R"({"model": {"type": "WordPiece", "vocab": {"a": 0}, "merges": []}})",
             {"mem/tokenizer.json", "WordPiece"});
  json_error(R"({"model": {"type": "BPE", "merges": ["a b"]}})", {"tokenizer.json", "model.vocab"});
  model_error(R"(, "merges": ["a b", "ab"]}})",
              {"tokenizer.json", "model.merges[1]", "two symbols"});
  model_error(R"(, "merges": [["a", "b", "c"]]}})", {"tokenizer.json", "two parts"});
  model_error(R"(, "merges": [["a", "q"]]}})",
              {"tokenizer.json", "model.merges[0]", "\"aq\"", "not in the vocabulary"});
  model_error(R"(, "merges": ["a b"]}, "added_tokens": [{"id": 300}]})",
              {"tokenizer.json", "added_tokens[0]", "content"});
  model_error("}}", {"tokenizer.json", "model.merges"});
  model_error("", {"tokenizer.json", "not valid JSON"});
}

// Random damage to every file must end in klein::Error or a working tokenizer, never in
// another exception or a crash.
TEST(LoadingErrors, RandomDamageOnlyEverThrowsKleinError) {
  const std::string vocab = small_vocab_json({"ab", "abc", "\xC3\xA9"});
  const std::string merges = small_merges_txt({{"a", "b"}, {"ab", "c"}, {"\xC3", "\xA9"}});
  const std::string config = R"({"added_tokens_decoder": {"300": {"content": "<x>"}}})";
  const std::string tokenizer_json = R"({"added_tokens": [{"id": 300, "content": "<x>"}], )"
                                     R"("model": {"type": "BPE", "vocab": )" +
                                     vocab + R"(, "merges": ["a b", ["ab", "c"]]}})";
  std::mt19937 rng(7);
  auto damage = [&](std::string s) {
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0: s[at] = char(rng()); break;                 // change a byte
        case 1: s.erase(at, 1 + rng() % 8); break;          // cut a few bytes
        default: s.insert(at, 1, "{}[]\":, 0\n\\"[rng() % 12]);  // add structure
      }
    }
    return s;
  };
  int loaded = 0, rejected = 0;
  for (int round = 0; round < 400; ++round) {
    std::string v = vocab, m = merges, c = config, t = tokenizer_json;
    switch (round % 4) {
      case 0: v = damage(v); break;
      case 1: m = damage(m); break;
      case 2: c = damage(c); break;
      default: t = damage(t); break;
    }
    TokenizerFiles f = files_of(v, m);
    f.tokenizer_config_json = c;
    if (round % 4 == 3) f.tokenizer_json = t;
    try {
      const Tokenizer tok(f);
      tok.decode(tok.encode("abc <x> \xC3\xA9 abab"));
      ++loaded;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "round " << round << ": not a klein::Error: " << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);
}

TEST(EncodingErrors, InvalidUtf8AndUnknownIds) {
  const Tokenizer t(files_of(small_vocab_json({"ab"}), small_merges_txt({{"a", "b"}})));
  expect_error([&] { t.encode("ok \xC3\x28 bad"); }, {"UTF-8"});
  expect_error([&] { t.encode("\xFF"); }, {"UTF-8"});
  expect_error([&] { t.decode(Ids{5000}); }, {"5000"});
  expect_error([&] { t.decode(Ids{-1}); }, {"-1"});
  expect_error([&] { t.token(9999); }, {"9999"});
}

}  // namespace
}  // namespace klein
