// `klein tokenize --template` and `klein encode-text` show the text conditioning of the model's
// own family, as generate runs it: for Z-Image (../shared/testdata/zimage-tiny: the official
// ZImagePipeline's ids, mask and hidden_states[-2] of the real tokens) and for FLUX.2-dev
// (tests/data/flux2-dev-tiny: the official Flux2Pipeline's chat under its system message, the
// ids and mask padded on the left, the Mistral3 context), from the diffusers directory and, for
// Z-Image, from a container of it. FLUX.2-klein's are tests/e2e/tokenize_test.cpp's.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;
using testing::shell_arg;

fs::path zimage_set() { return testing::tiny_dir().parent_path() / "zimage-tiny"; }
using testing::dev_set;

// Any text quoted for the shell of run_klein.
std::string quoted(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// The output's lines but the warnings (which go to stderr, captured with stdout).
std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t eol; (eol = output.find('\n', start)) != std::string::npos; start = eol + 1) {
    std::string line = output.substr(start, eol - start);
    if (!line.starts_with("warning:")) lines.push_back(std::move(line));
  }
  return lines;
}

Ids ids_of(const std::string& line) {
  Ids ids;
  size_t pos = 0;
  while (pos < line.size()) {
    size_t used = 0;
    ids.push_back(std::stoi(line.substr(pos), &used));
    pos += used;
  }
  return ids;
}

Ids read_ids(const fs::path& npy) {
  const std::vector<int64_t> v = read_npy(npy).to_i64();
  return Ids(v.begin(), v.end());
}

// `klein tokenize -m MODEL --template -p PROMPT`: the ids line and the mask line.
std::vector<Ids> template_ids(const fs::path& model, const std::string& prompt) {
  std::string out;
  EXPECT_EQ(testing::run_klein("tokenize -m " + shell_arg(model) + " --template -p " +
                                   quoted(prompt),
                               &out),
            0)
      << out;
  std::vector<Ids> lines;
  for (const std::string& line : lines_of(out)) lines.push_back(ids_of(line));
  EXPECT_EQ(lines.size(), 2u) << out;
  return lines;
}

// The same with --json.
json template_json(const fs::path& model, const std::string& prompt) {
  std::string out;
  EXPECT_EQ(testing::run_klein("tokenize -m " + shell_arg(model) + " --template --json -p " +
                                   quoted(prompt),
                               &out),
            0)
      << out;
  const std::vector<std::string> lines = lines_of(out);
  EXPECT_EQ(lines.size(), 1u) << out;
  return lines.empty() ? json() : json::parse(lines.back());
}

// `klein encode-text -m MODEL -p PROMPT`, without the prompt cache: the saved context.
NpyArray encoded(const fs::path& model, const std::string& prompt, const fs::path& out) {
  std::string log;
  EXPECT_EQ(testing::run_klein("encode-text -m " + shell_arg(model) + " -p " + quoted(prompt) +
                                   " --no-cache --threads 2 -o " + shell_arg(out),
                               &log),
            0)
      << log;
  return read_npy(out);
}

json zimage_prompts() {
  return json::parse(
      read_text_file(zimage_set() / "vectors" / "tokenizer" / "prompts.json"))["prompts"];
}

// Every prompt of the set (ASCII, CJK with emoji and accents, a negative prompt, the empty
// string, one cut at 512 tokens): the padded ids and the mask the pipeline's tokenizer call
// gives, and the chat text.
void expect_zimage_ids(const fs::path& model) {
  const json prompts = zimage_prompts();
  ASSERT_EQ(prompts.size(), 5u);
  for (const json& p : prompts) {
    const std::string stem = "prompt" + std::to_string(p["index"].get<int>());
    SCOPED_TRACE(stem);
    const std::string prompt = p["prompt"].get<std::string>();
    const std::vector<Ids> lines = template_ids(model, prompt);
    ASSERT_EQ(lines.size(), 2u);
    const fs::path dir = zimage_set() / "vectors" / "tokenizer";
    EXPECT_EQ(lines[0], read_ids(dir / (stem + "_input_ids.npy")));
    EXPECT_EQ(lines[1], read_ids(dir / (stem + "_attention_mask.npy")));
    const json j = template_json(model, prompt);
    EXPECT_EQ(j["chat_text"], p["chat_text"]);
    EXPECT_EQ(j["real_tokens"], p["num_tokens"]);
    EXPECT_EQ(j["dropped"].get<int>(),
              p["untruncated_length"].get<int>() - p["num_tokens"].get<int>());
  }
}

// The context of every prompt: hidden_states[-2] of the real tokens only, [1, tokens, hidden],
// within the tolerance of the Z-Image text encoder's own test (tests/zimage/text_test.cpp).
void expect_zimage_contexts(const fs::path& model, const fs::path& out) {
  for (const json& p : zimage_prompts()) {
    const std::string stem = "prompt" + std::to_string(p["index"].get<int>());
    SCOPED_TRACE(stem);
    const NpyArray got = encoded(model, p["prompt"].get<std::string>(), out / (stem + ".npy"));
    const fs::path ref = zimage_set() / "vectors" / "text_encoder" / (stem + "_embeds.npy");
    const NpyArray want = read_npy(ref);
    ASSERT_EQ(want.shape.size(), 2u);
    EXPECT_EQ(got.shape, (std::vector<int64_t>{1, want.shape[0], want.shape[1]}));
    const std::vector<float> values = got.to_f32();
    EXPECT_TRUE(testing::matches_npy(values.data(), int64_t(values.size()), ref, 1e-4));
  }
}

TEST(FamilyText, ZImageTokenizeGivesTheOfficialIds) {
  expect_zimage_ids(zimage_set() / "model");
}

TEST(FamilyText, ZImageEncodeTextGivesTheOfficialEmbeddings) {
  expect_zimage_contexts(zimage_set() / "model", testing::temp_dir("family-text-zimage"));
}

// A container keeps the family: the same ids and contexts from it.
TEST(FamilyText, ZImageContainerGivesTheSame) {
  const fs::path out = testing::temp_dir("family-text-zimage-container");
  const fs::path container = out / "zimage.klein";
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + shell_arg(zimage_set() / "model") +
                                   " -t bf16 -q -o " + shell_arg(container),
                               &log),
            0)
      << log;
  expect_zimage_ids(container);
  expect_zimage_contexts(container, out);
}

// The four chat prompts of the official tokenizer's vectors (one empty, one with [IMG] and
// control tokens written in the text): the rendered chat and its ids, which end the padded
// ids (the tokenizer pads on the left) with <pad> before them.
TEST(FamilyText, DevTokenizeGivesTheOfficialChat) {
  const fs::path model = dev_set() / "model";
  const json vectors = json::parse(read_text_file(dev_set() / "tokenizer_vectors.json"));
  ASSERT_EQ(vectors["prompts"].size(), 4u);
  for (const json& p : vectors["prompts"]) {
    const std::string prompt = p["prompt"].get<std::string>();
    SCOPED_TRACE(prompt);
    const json j = template_json(model, prompt);
    EXPECT_EQ(j["chat_text"], p["rendered"]);
    const Ids want = p["ids"].get<Ids>();
    ASSERT_EQ(j["real_tokens"].get<size_t>(), want.size());
    const Ids ids = j["ids"].get<Ids>(), mask = j["attention_mask"].get<Ids>();
    ASSERT_EQ(ids.size(), 512u);
    ASSERT_EQ(mask.size(), 512u);
    const size_t pad = 512 - want.size();
    EXPECT_EQ(Ids(ids.begin() + ptrdiff_t(pad), ids.end()), want);
    EXPECT_EQ(Ids(ids.begin(), ids.begin() + ptrdiff_t(pad)), Ids(pad, 11));  // <pad>
    EXPECT_EQ(Ids(mask.begin(), mask.begin() + ptrdiff_t(pad)), Ids(pad, 0));
    EXPECT_EQ(Ids(mask.begin() + ptrdiff_t(pad), mask.end()), Ids(want.size(), 1));
  }
}

// The official pipeline run from a prompt (vectors/e2e_prompt): the ids and mask its text
// encoder received, and the context its transformer received.
TEST(FamilyText, DevTokenizeAndEncodeTextGiveThePipelinesInput) {
  const fs::path model = dev_set() / "model";
  const json c = json::parse(read_text_file(dev_set() / "spec.json"))["e2e_prompt"][0];
  const fs::path ref = dev_set() / "vectors" / "e2e_prompt" / c["name"].get<std::string>();
  const std::string prompt = c["prompt"].get<std::string>();
  const std::vector<Ids> lines = template_ids(model, prompt);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], read_ids(ref / "input_ids.npy"));
  EXPECT_EQ(lines[1], read_ids(ref / "attention_mask.npy"));

  const NpyArray got = encoded(model, prompt, testing::temp_dir("family-text-dev") / "c.npy");
  EXPECT_EQ(got.shape, (std::vector<int64_t>{1, 512, 144}));
  const std::vector<float> values = got.to_f32();
  // The tolerance of the dev pipeline's own test of this context (flux2_dev_test.cpp).
  EXPECT_TRUE(testing::matches_npy(values.data(), int64_t(values.size()),
                                   ref / "prompt_embeds.npy", 1e-4));
}

}  // namespace
}  // namespace klein
