// The tokenizer against the golden vectors of klein-tiny (the reference tokenizer's output)
// and the worked examples of spec/qwen3-tokenizer.md section 7.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <thread>

#include "core/files.h"
#include "core/npy.h"
#include "families/flux2_klein/prompt.h"
#include "support/testing.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

const Tokenizer& qwen3() {
  static const Tokenizer tokenizer = Tokenizer::from_directory(testing::tiny_model() / "tokenizer");
  return tokenizer;
}

json read_json(const std::string& name) {
  return json::parse(read_text_file(testing::tiny_vectors() / "tokenizer" / name));
}

Ids read_ids_npy(const std::string& name) {
  std::vector<int64_t> v = read_npy(testing::tiny_vectors() / "tokenizer" / name).to_i64();
  return Ids(v.begin(), v.end());
}

TEST(Tokenizer, LoadsTheQwen3Vocabulary) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151643u);
  EXPECT_EQ(t.merge_count(), 151387u);
  ASSERT_EQ(t.added_tokens().size(), 26u);
  EXPECT_EQ(t.token_id("<|endoftext|>"), 151643);
  EXPECT_EQ(t.token_id("<|im_start|>"), 151644);
  EXPECT_EQ(t.token_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_id("<think>"), 151667);
  EXPECT_EQ(t.token_id("</think>"), 151668);
  EXPECT_EQ(t.token_id("user"), 872);
  EXPECT_EQ(t.token_id("assistant"), 77091);
  EXPECT_EQ(t.token_id("Ċ"), 198);
  EXPECT_EQ(t.token_id("ĊĊ"), 271);
  EXPECT_EQ(t.token_id("Ġ"), 220);
  EXPECT_EQ(t.token_id("no such token"), -1);
  EXPECT_TRUE(t.added_tokens().front().special);  // <|endoftext|>
  EXPECT_FALSE(t.added_tokens().back().special);  // </think>
}

// Every string of strings.json: ids, tokens and decoded text exactly as the reference.
TEST(Tokenizer, MatchesEveryGoldenString) {
  const json cases = read_json("strings.json")["cases"];
  ASSERT_GE(cases.size(), 60u);
  for (const json& c : cases) {
    const std::string text = c["text"];
    SCOPED_TRACE("case " + std::to_string(c["index"].get<int>()) + ": " + text.substr(0, 60));
    const Ids ids = qwen3().encode(text);
    EXPECT_EQ(ids, c["ids"].get<Ids>());
    std::vector<std::string> tokens;
    for (int32_t id : ids) tokens.push_back(qwen3().token(id));
    EXPECT_EQ(tokens, c["tokens"].get<std::vector<std::string>>());
    EXPECT_EQ(qwen3().decode(ids), c["decoded"].get<std::string>());
  }
}

// The three pipeline prompts: padded ids and mask exactly as the .npy files.
TEST(KleinPrompt, MatchesThePipelineInputs) {
  const json prompts = read_json("prompts.json")["prompts"];
  ASSERT_EQ(prompts.size(), 3u);
  for (const json& p : prompts) {
    const int index = p["index"];
    SCOPED_TRACE("prompt " + std::to_string(index));
    const std::string prompt = p["prompt"];
    EXPECT_EQ(klein_chat_text(prompt), p["chat_text"].get<std::string>());

    const PromptTokens got = tokenize_klein_prompt(qwen3(), prompt);
    const std::string stem = "prompt" + std::to_string(index);
    EXPECT_EQ(got.ids, read_ids_npy(stem + "_input_ids.npy"));
    EXPECT_EQ(got.mask, read_ids_npy(stem + "_attention_mask.npy"));
    EXPECT_EQ(got.real_tokens, p["num_real_tokens"].get<int>());
    EXPECT_EQ(got.pad_id, 151643);
    const int untruncated = p["untruncated_length"];
    EXPECT_EQ(got.dropped, untruncated - got.real_tokens);
    EXPECT_EQ(got.warning.empty(), !p["truncated"].get<bool>());
  }
}

TEST(KleinPrompt, LongPromptReportsWhatWasDropped) {
  const json prompts = read_json("prompts.json")["prompts"];
  const std::string prompt = prompts[2]["prompt"];
  const PromptTokens got = tokenize_klein_prompt(qwen3(), prompt);
  EXPECT_EQ(got.real_tokens, 512);
  EXPECT_EQ(got.dropped, 1030 - 512);
  EXPECT_NE(got.warning.find("1030"), std::string::npos) << got.warning;
  EXPECT_NE(got.warning.find("518"), std::string::npos) << got.warning;
  // The cut loses the end of the template: no <|im_end|> among the kept ids.
  EXPECT_EQ(std::count(got.ids.begin(), got.ids.end(), 151645), 0);
}

TEST(KleinPrompt, EmptyPromptIsTheTemplateAlone) {
  const PromptTokens got = tokenize_klein_prompt(qwen3(), "");
  const Ids expected = {151644, 872,    198, 151645, 198, 151644,
                        77091,  198, 151667, 271, 151668, 271};
  EXPECT_EQ(Ids(got.ids.begin(), got.ids.begin() + 12), expected);
  EXPECT_EQ(got.real_tokens, 12);
  EXPECT_EQ(got.dropped, 0);
  EXPECT_TRUE(got.warning.empty());
  for (size_t i = 12; i < got.ids.size(); ++i) {
    ASSERT_EQ(got.ids[i], 151643) << i;
    ASSERT_EQ(got.mask[i], 0) << i;
  }
}

TEST(KleinPrompt, ExactlyFullPromptDropsNothing) {
  // 12 template tokens + 500 single-token words fill the 512 ids exactly.
  std::string prompt;
  for (int i = 0; i < 500; ++i) prompt += i ? " cat" : "cat";
  const PromptTokens got = tokenize_klein_prompt(qwen3(), prompt);
  EXPECT_EQ(got.real_tokens, 512);
  EXPECT_EQ(got.dropped, 0);
  EXPECT_TRUE(got.warning.empty());
  const PromptTokens over = tokenize_klein_prompt(qwen3(), prompt + " cat");
  EXPECT_EQ(over.dropped, 1);
  EXPECT_FALSE(over.warning.empty());
}

// Spec 7.1: full ids of the rendered template for three prompts.
TEST(Tokenizer, SpecFullTemplateExamples) {
  const std::vector<std::pair<std::string, Ids>> cases = {
      {"a cat on a skateboard",
       {151644, 872, 198, 64, 8251, 389, 264, 97982, 151645, 198, 151644, 77091, 198, 151667, 271,
        151668, 271}},
      {"My dog Rocket, who is an Akita, eating burgers at a really cool biker bar in rural "
       "Oklahoma",
       {151644, 872, 198, 5050, 5562, 39218, 11, 879, 374, 458, 16358, 6255, 11, 12182, 62352, 518,
        264, 2167, 7010, 293, 24803, 3619, 304, 19082, 22797, 151645, 198, 151644, 77091, 198,
        151667, 271, 151668, 271}},
      {"It's 3 cats & 2 dogs (100% good) \u2014 don't stop!",
       {151644, 872, 198, 2132, 594, 220, 18, 19423, 609, 220, 17, 12590, 320, 16, 15, 15, 4, 1661,
        8, 1959, 1513, 944, 2936, 0, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271}},
  };
  for (const auto& [prompt, ids] : cases)
    EXPECT_EQ(qwen3().encode(klein_chat_text(prompt)), ids) << prompt;
}

// Spec 7.2: pieces of the pre-tokenizer.
TEST(Pretokenizer, SpecPieceExamples) {
  using Pieces = std::vector<std::string>;
  const tok::Pretokenizer pre;
  EXPECT_EQ(pre.split("user\nIt's 3 cats & 2 dogs (100% good) \u2014 don't stop!"),
            (Pieces{"user", "\n", "It", "'s", " ", "3", " cats", " &", " ", "2", " dogs", " (", "1",
                    "0", "0", "%", " good", ")", " \u2014", " don", "'t", " stop", "!"}));
  EXPECT_EQ(pre.split("a   b\n\n  c"), (Pieces{"a", "  ", " b", "\n\n", " ", " c"}));
  EXPECT_EQ(pre.split("user\n\nfoo"), (Pieces{"user", "\n\n", "foo"}));
  EXPECT_EQ(pre.split("x \n y"), (Pieces{"x", " \n", " y"}));
  EXPECT_EQ(pre.split("(hello)world"), (Pieces{"(hello", ")world"}));
}

// A prompt starting with a newline changes how the template's "\n" is tokenized (spec 7.2).
TEST(Tokenizer, PromptJoinsTheTemplateSegment) {
  const Ids ids = qwen3().encode(klein_chat_text("\nfoo"));
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[1], 872);
  EXPECT_EQ(ids[2], 271);  // "\n\n", not 198 + 198
}

TEST(Pretokenizer, WhiteSpaceIsTheUnicodeProperty) {
  const tok::Pretokenizer pre;
  // U+0085 NEXT LINE is white space, so it attaches to the next word like a space does.
  EXPECT_EQ(pre.split("a\u0085\u0085b"), (std::vector<std::string>{"a", "\u0085", "\u0085b"}));
  // U+200B ZERO WIDTH SPACE is not: it is "other", and joins the following letters.
  EXPECT_EQ(pre.split("a\u200bb"), (std::vector<std::string>{"a", "\u200bb"}));
}

TEST(Tokenizer, RoundTripsLongAndUnusualInputs) {
  const std::vector<std::string> inputs = {
      std::string(20000, ' '),       std::string(20000, 'a'), std::string(5000, '7'),
      std::string(3000, '\n') + "x", "\xF0\x9F\x98\x80 tail", std::string(4000, '!'),
      std::string("nul\0byte", 8),
  };
  for (const std::string& s : inputs) {
    const Ids ids = qwen3().encode(s);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(qwen3().decode(ids), s) << s.substr(0, 20);
  }
}

// Any text comes back from decode(encode(text)) as its NFC form: no byte is lost or added,
// whatever mix of scripts, marks, spaces and symbols it has.
TEST(Tokenizer, RoundTripsRandomUnicode) {
  std::mt19937 rng(3);
  // Code points from ranges with different regex classes: ASCII, Latin-1 with NBSP and NEL,
  // combining marks, Greek, CJK, Hangul, emoji and the other White_Space characters.
  const std::vector<std::pair<char32_t, char32_t>> ranges = {
      {0x00, 0x7F},     {0x80, 0xFF},     {0x300, 0x36F},     {0x391, 0x3C9},   {0x4E00, 0x4E40},
      {0xAC00, 0xAC20}, {0x1F600, 0x1F64F}, {0x2000, 0x200D}, {0x3000, 0x3003}, {0x1100, 0x1175},
  };
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int length = 1 + int(rng() % 40);
    for (int i = 0; i < length; ++i) {
      const auto& [lo, hi] = ranges[rng() % ranges.size()];
      tok::append_utf8(text, lo + char32_t(rng() % (hi - lo + 1)));
    }
    const Ids ids = qwen3().encode(text);
    ASSERT_EQ(qwen3().decode(ids), tok::nfc(text)) << "round " << round;
  }
}

TEST(Tokenizer, DecodeReplacesBrokenCharacters) {
  // A lone lead byte (0xE6, spelled "æ" in the byte-level alphabet) is not a character.
  const int32_t lead = qwen3().token_id("\xC3\xA6");
  ASSERT_GE(lead, 0);
  EXPECT_EQ(qwen3().decode(Ids{lead}), "\xEF\xBF\xBD");  // U+FFFD
  EXPECT_EQ(qwen3().decode(Ids{lead, 64}), std::string("\xEF\xBF\xBD") + "a");
  EXPECT_EQ(qwen3().decode(Ids{151644, 872, 151645}, /*skip_special=*/true), "user");
  EXPECT_EQ(qwen3().decode(Ids{151667, 151668}, /*skip_special=*/true), "<think></think>");
}

TEST(Tokenizer, EncodesFromManyThreadsAtOnce) {
  const std::string text = read_json("prompts.json")["prompts"][1]["chat_text"];
  const Ids expected = qwen3().encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (size_t t = 0; t < ok.size(); ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) ok[t] += qwen3().encode(text) == expected;
    });
  for (auto& th : threads) th.join();
  for (int n : ok) EXPECT_EQ(n, 50);
}

}  // namespace
}  // namespace klein
