// The prompt check (pipeline/prompt_check.h) against BFL's reference and transformers:
// - the chat holds BFL's texts verbatim (black-forest-labs/flux2 ab7cca68,
//   src/flux2/system_messages.py, copied below from that file);
// - the answer is what transformers' greedy generate() picks with BFL's yes_no_logit_processor:
//   on BFL's own chat for 24 model/prompt pairs (tests/data/prompt-check, made by
//   tools/refgen/gen_prompt_check.py with transformers' generate): the same ids, logits and
//   verdicts, on every instruction set, both answers among the cases;
// - the front ends: `klein check-prompt`, and `klein generate --check-prompt`, which stops a
//   flagged prompt before any image work (exit status 2, no file) and generates a passed one;
//   a model without its language-model head and a tokenizer without one-token "yes"/"no" are
//   refused by name.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/compute.h"
#include "pipeline/prompt_check.h"
#include "pipeline/stages.h"
#include "support/isa.h"
#include "support/testing.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "weights/config.h"
#include "weights/model_source.h"
#include "weights/naming.h"
#include "zimage/file_store.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// src/flux2/system_messages.py at ab7cca68018ad3ceadcace9d6ecb1bc1f6f46b4e.
const char* const kBflContentFilter = R"(
You are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French startup headquartered in Paris.
Your task is identifying images and text for copyright concerns and depictions of public personas.
)";

// PROMPT_TEXT_INTEGRITY (a Python str.format template; stripped), the prompt put in as
// str.format would.
std::string bfl_text_integrity(const std::string& prompt) {
  std::string t = R"(
Task: Analyze a text prompt to identify potential copyright concerns or requests to depict living public figures.

Output: Respond with only "yes" or "no"

Criteria for "Yes":
- The prompt explicitly names a character from copyrighted media (movies, TV, comics, games, etc.)
- The prompt explicitly mentions a trademarked logo or brand
- The prompt names or describes a specific living public figure (celebrities, politicians, athletes, influencers, etc.)

Criteria for "No":
- All other cases
- When you cannot identify the specific copyrighted work or named individual

Critical Requirements:
1. You must be able to name the exact copyrighted work or specific person referenced
2. General demographic descriptions or characteristics are not sufficient
3. Analyze only the prompt text, not potential image outcomes
4. Provide only the one-word answer: "yes" or "no"

The prompt to check is:
-----
{prompt}
-----

Does this prompt have copyright concerns or includes public figures?
)";
  t = t.substr(1, t.size() - 2);  // .strip(): the template's first and last newline
  return t.replace(t.find("{prompt}"), 8, prompt);
}

TEST(PromptCheck, TheChatHoldsBflsMessagesVerbatim) {
  EXPECT_EQ(prompt_check_system(), kBflContentFilter);
  for (const std::string prompt : {"a cat", "", "Darth Vader {prompt} \"quoted\"\nsecond line"})
    EXPECT_EQ(prompt_check_request(prompt), bfl_text_integrity(prompt)) << prompt;
}

// torch.argmax over the processed scores: every other id is below both, so the larger of the
// two wins, and a tie goes to the lower id (the first maximum).
TEST(PromptCheck, TheAnswerIsTheGreedyPickAmongYesAndNo) {
  EXPECT_TRUE(prompt_check_says_yes(1.5f, 1.25f, 9693, 2152));
  EXPECT_FALSE(prompt_check_says_yes(1.25f, 1.5f, 9693, 2152));
  EXPECT_FALSE(prompt_check_says_yes(2.0f, 2.0f, 9693, 2152));  // "no" has the lower id
  EXPECT_TRUE(prompt_check_says_yes(2.0f, 2.0f, 5, 9));
  EXPECT_TRUE(prompt_check_says_yes(-3.0f, -4.0f, 9693, 2152));
}

struct Models {
  std::unique_ptr<WeightStore> tied = open_model(testing::tiny_model());
  std::unique_ptr<WeightStore> untied = [] {
    const fs::path te = testing::upsample_dir() / "model-untied" / "text_encoder";
    std::ifstream in(te / "config.json");
    ModelConfig config;
    config.text_encoder =
        parse_text_encoder_config(json::parse(in), "untied config.json", {9, 18, 27});
    return std::unique_ptr<WeightStore>(std::make_unique<testing::ComponentFileStore>(
        te / "model.safetensors.index.json", "text_encoder", component_unit_of, config));
  }();
  Tokenizer tokenizer = Tokenizer::from_directory(testing::tiny_model() / "tokenizer");
};

// tests/data/prompt-check: BFL's check run by transformers' generate on three tiny Qwen3 text
// encoders, eight prompts each (its README). The chat's ids are the same, the two logits within
// float32 noise of an independent implementation, and the verdict the same, on every
// instruction set; with the fixed part kept by a PromptChecker too.
class PromptCheckReference : public ::testing::TestWithParam<quant::Isa> {};

TEST_P(PromptCheckReference, TransformersGenerateGivesTheSameTokensAndVerdicts) {
  KLEIN_REQUIRE_ISA(GetParam());
  std::ifstream in(fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "prompt-check" / "cases.json");
  const json ref = json::parse(in);
  static Models models;
  static Model nine_b_model =
      Model::open(ModelPaths{.model = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" /
                                      "klein-tiny-9b" / "model"});
  Compute cx(2, GetParam());
  const FamilyStages& family = stages_for(models.tied->config());
  int flagged = 0, passed = 0;
  for (const json& c : ref["cases"]) {
    const std::string model = c["model"], prompt = c["prompt"];
    SCOPED_TRACE(model + ": " + prompt);
    const std::vector<int32_t> ids = family.upsample_chat(
        models.tokenizer, prompt_check_system(), prompt_check_request(prompt)).ids;
    EXPECT_EQ(qwen3_chat_text(prompt_check_system(), prompt_check_request(prompt), false),
              c["chat_text"].get<std::string>());
    ASSERT_EQ(ids, c["input_ids"].get<std::vector<int32_t>>());
    WeightStore& weights = model == "klein-tiny"        ? *models.tied
                           : model == "upsample-untied" ? *models.untied
                                                        : *nine_b_model.weights;
    const PromptCheck r = prompt_check_answer(weights, models.tokenizer, cx, ids);
    EXPECT_EQ(r.yes_id, ref["yes_id"].get<int32_t>());
    EXPECT_EQ(r.no_id, ref["no_id"].get<int32_t>());
    EXPECT_NEAR(r.yes_logit, c["yes_logit"].get<double>(), 2e-3);
    EXPECT_NEAR(r.no_logit, c["no_logit"].get<double>(), 2e-3);
    EXPECT_EQ(r.flagged, c["flagged"].get<bool>());
    EXPECT_EQ(r.flagged ? r.yes_id : r.no_id, c["generated_id"].get<int32_t>());
    (r.flagged ? flagged : passed) += 1;
  }
  EXPECT_EQ(flagged + passed, 24);
  EXPECT_GT(flagged, 0);
  EXPECT_GT(passed, 0);
  // The whole path on the tiny klein-9B: the chat made, the fixed part kept from the first.
  PromptChecker checker(nine_b_model, cx);
  for (const json& c : ref["cases"]) {
    if (c["model"] != "klein-tiny-9b") continue;
    const PromptCheck r = checker.check(c["prompt"].get<std::string>());
    EXPECT_EQ(r.flagged, c["flagged"].get<bool>()) << c["prompt"];
    EXPECT_NEAR(r.no_logit, c["no_logit"].get<double>(), 2e-3) << c["prompt"];
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, PromptCheckReference, ::testing::ValuesIn(testing::compiled_isas()),
                         [](const auto& info) { return std::string(quant::isa_name(info.param)); });

// The tiny klein-9B (Qwen3-8B's layout, untied head) answers both ways on these prompts, as
// transformers does (tests/data/prompt-check).
fs::path nine_b() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "klein-tiny-9b" / "model"; }
const char* const kPrompts[] = {"Mickey Mouse eating ice cream", "a bowl of fruit"};

// The kept keys and values of BFL's fixed text give the answer a whole prefill gives, for
// prompts whose first characters could join the text's last token; a second checker on the
// same prompt cache directory reads them instead of computing them.
TEST(PromptChecker, KeptTextGivesTheWholePrefillsAnswer) {
  Model model = Model::open(ModelPaths{.model = nine_b()});
  Compute cx(2);
  const fs::path dir = testing::temp_dir("prompt_checker_cache");
  PromptChecker checker(model, cx, dir);
  EXPECT_GT(checker.fixed_tokens(), 230);
  bool first = true;
  for (const std::string prompt : {"a bowl of fruit", "\n\nDarth Vader", "-----", " ", "",
                                   "Mickey Mouse eating ice cream", "\t'quoted'"}) {
    SCOPED_TRACE(prompt);
    const FamilyStages& family = stages_for(model.weights->config());
    const std::vector<int32_t> ids = family.upsample_chat(model.tokenizer, prompt_check_system(),
                                                          prompt_check_request(prompt)).ids;
    const PromptCheck whole = prompt_check_answer(*model.weights, model.tokenizer, cx, ids);
    const PromptCheck kept = checker.check(prompt);
    EXPECT_EQ(kept.chat_tokens, int(ids.size()));
    EXPECT_EQ(kept.reused_tokens, first ? 0 : checker.fixed_tokens());  // the first computes
    EXPECT_FALSE(kept.prefix_from_cache);  // computed by the first check, kept since
    EXPECT_TRUE(kept.store_error.empty()) << kept.store_error;
    EXPECT_NEAR(kept.yes_logit, whole.yes_logit, 1e-4);
    EXPECT_NEAR(kept.no_logit, whole.no_logit, 1e-4);
    EXPECT_EQ(kept.flagged, whole.flagged);
    if (first) {
      ASSERT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
    }
    first = false;
  }
  PromptChecker again(model, cx, dir);
  const PromptCheck read = again.check("a bowl of fruit");
  EXPECT_TRUE(read.prefix_from_cache);
  EXPECT_EQ(read.reused_tokens, checker.fixed_tokens());
  EXPECT_NEAR(read.no_logit, checker.check("a bowl of fruit").no_logit, 1e-6);
  // Without a directory nothing is read or stored.
  EXPECT_FALSE(PromptChecker(model, cx).check("a bowl of fruit").prefix_from_cache);
  fs::remove_all(dir);
}

// `klein check-prompt --json` on one prompt (exit status 0 or 2 by its verdict).
json check_json(const std::string& model, const std::string& prompt, bool flagged) {
  return testing::klein_json("check-prompt --no-cache --threads 2 -m " + model + " -p " +
                                 testing::shell_arg(prompt),
                             flagged ? 2 : 0);
}

TEST(PromptCheckCli, GenerateStopsAFlaggedPromptBeforeAnyWorkAndRunsAPassedOne) {
  const fs::path dir = testing::temp_dir("prompt_check_cli");
  const std::string model = testing::shell_arg(nine_b());
  bool seen[2] = {false, false};
  std::string passed, flagged_prompt;
  for (const std::string prompt : kPrompts) {
    SCOPED_TRACE(prompt);
    // klein check-prompt: the verdict, its exit status, and the chat's length.
    std::string out;
    const int status = testing::run_klein(
        "check-prompt --no-cache --threads 2 -m " + model + " -p " + testing::shell_arg(prompt), &out);
    const bool flagged = status == 2;
    const json c = check_json(model, prompt, flagged);
    EXPECT_EQ(c.value("flagged", !flagged), flagged);
    seen[flagged] = true;
    (flagged ? flagged_prompt : passed) = prompt;
    EXPECT_EQ(status, flagged ? 2 : 0) << out;
    EXPECT_NE(out.find(flagged ? "FLAGGED: " + prompt : "passed: " + prompt), std::string::npos)
        << out;
    EXPECT_GT(c.value("chat_tokens", 0), 250);
    EXPECT_EQ(flagged, c.value("yes_logit", 0.0) > c.value("no_logit", 0.0));

    // generate --check-prompt: the same verdict; flagged, no image and nothing else done.
    const fs::path png = dir / (std::string(flagged ? "flagged" : "passed") + ".png");
    std::string log;
    const int generated = testing::run_klein(
        "generate --json --no-cache --check-prompt -m " + model + " -p " +
            testing::shell_arg(prompt) + " -W 32 -H 32 -s 1 --seed 1 --threads 2 -o " +
            testing::shell_arg(png), &log);
    EXPECT_NE(log.find("\"event\":\"prompt_check\""), std::string::npos) << log;
    EXPECT_NE(log.find(std::string("\"flagged\":") + (flagged ? "true" : "false")),
              std::string::npos) << log;
    if (flagged) {
      EXPECT_EQ(generated, 2) << log;
      EXPECT_FALSE(fs::exists(png));
      EXPECT_NE(log.find("flagged by --check-prompt for potential copyright or public personas "
                         "concerns"), std::string::npos) << log;
      // No image work began: no memory plan, no text encoding.
      EXPECT_EQ(log.find("\"event\":\"memory\""), std::string::npos) << log;
      EXPECT_EQ(log.find("\"phase\":\"text encoder\""), std::string::npos) << log;
    } else {
      EXPECT_NE(log.find("\"phase\":\"text encoder\""), std::string::npos) << log;
      EXPECT_EQ(generated, 0) << log;
      EXPECT_TRUE(fs::exists(png));
    }
  }
  ASSERT_TRUE(seen[0] && seen[1]) << "the prompts no longer give both answers";

  // A batch stops before its first image when any of its prompts is flagged.
  const fs::path list = dir / "prompts.txt";
  std::ofstream(list) << passed << "\n" << flagged_prompt << "\n";
  std::string log;
  EXPECT_EQ(testing::run_klein("generate --no-cache --check-prompt -m " + model + " --prompts " +
                                   testing::shell_arg(list) +
                                   " -W 32 -H 32 -s 1 --seed 1 --threads 2 -o " +
                                   testing::shell_arg(dir / "batch.png"), &log),
            2) << log;
  EXPECT_FALSE(fs::exists(dir / "batch-0.png"));
  EXPECT_FALSE(fs::exists(dir / "batch-1.png"));
  fs::remove_all(dir);
}

TEST(PromptCheckCli, ModelsThatCannotAnswerAreRefusedByName) {
  const fs::path dir = testing::temp_dir("prompt_check_refused");
  // A container keeps only the layers generation reads: no final norm or head.
  const fs::path container = dir / "tiny.klein";
  ASSERT_TRUE(testing::convert_tiny(container, "-t bf16"));
  std::string log;
  EXPECT_EQ(testing::run_klein("generate --check-prompt --no-cache -m " +
                                   testing::shell_arg(container) +
                                   " -p fox -W 32 -H 32 -s 1 -o " + testing::shell_arg(dir / "x.png"),
                               &log), 1) << log;
  EXPECT_NE(log.find("--check-prompt: this model cannot check prompts: its text encoder lacks"),
            std::string::npos) << log;
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  EXPECT_EQ(testing::run_klein("check-prompt --no-cache -p fox -m " + testing::shell_arg(container), &log), 1);
  EXPECT_NE(log.find("this model cannot check prompts"), std::string::npos) << log;

  // The tiny FLUX.2-dev's tokenizer (a small Tekken BPE) writes "yes" as two tokens.
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  EXPECT_EQ(testing::run_klein("check-prompt --no-cache -p fox -m " + testing::shell_arg(dev), &log), 1);
  EXPECT_NE(log.find("this model cannot check prompts: the check reads the answer as one "
                     "token, \"yes\" or \"no\", as BFL's does, and the model's tokenizer "
                     "writes \"yes\" as 2 tokens"), std::string::npos) << log;
  EXPECT_EQ(testing::run_klein("check-prompt --no-cache -m " + testing::shell_arg(dev), &log), 1);
  EXPECT_NE(log.find("give the prompt with -p"), std::string::npos) << log;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace klein
