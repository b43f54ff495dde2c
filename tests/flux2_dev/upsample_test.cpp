// FLUX.2-dev's prompt upsampling with its Mistral language model against diffusers'
// Flux2Pipeline.upsample_prompt (transformers' generate) on ../shared/testdata/upsample-mistral
// (its README lists every file and fact): the chat text and ids (the pipeline's left padding
// to 2048 ids left out: the pads are masked and the positions count from the first real
// token, so the chat runs unpadded), the logits of the prefill and of the first cached step,
// the top-16 logits and the greedy or sampled token of every step, the sampling support
// (temperature 0.15, top-k 50) with its probabilities, on every instruction set, and the
// decoded, cleaned-up answer of the whole loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/npy.h"
#include "families/flux2_dev/prompt.h"
#include "models/qwen3/generate.h"
#include "models/qwen3/language_model.h"
#include "ops/compute.h"
#include "pipeline/stages.h"
#include "pipeline/upsample.h"
#include "support/isa.h"
#include "support/testing.h"
#include "tokenizer/tokenizer.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path set_dir() { return testing::tiny_dir().parent_path() / "upsample-mistral"; }

ModelPaths model_paths() {
  ModelPaths p;
  p.text_encoder = set_dir() / "model" / "text_encoder" / "model.safetensors.index.json";
  p.tokenizer = set_dir() / "model" / "tokenizer";
  return p;
}

Model& model() {
  static Model m = open_upsample_model(model_paths());
  return m;
}

struct Case {
  std::string name;
  json spec;
  std::vector<int32_t> padded, mask, generated;
  fs::path dir;

  explicit Case(const std::string& n) : name(n), dir(set_dir() / "cases" / n) {
    std::ifstream in(dir / "case.json");
    spec = json::parse(in);
    for (int64_t v : read_npy(dir / "input_ids.npy").to_i64()) padded.push_back(int32_t(v));
    for (int64_t v : read_npy(dir / "attention_mask.npy").to_i64()) mask.push_back(int32_t(v));
    for (int64_t v : read_npy(dir / "generated_ids.npy").to_i64()) generated.push_back(int32_t(v));
  }
  bool greedy() const { return spec["mode"] == "greedy"; }
  // The ids the attention mask keeps: the chat without its padding.
  std::vector<int32_t> real_ids() const {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < padded.size(); ++i)
      if (mask[i]) ids.push_back(padded[i]);
    return ids;
  }
};

const std::vector<std::string>& all_cases() {
  static const std::vector<std::string> names = {"cat", "city_night", "img_tag", "forest_s1",
                                                 "robot_s2"};
  return names;
}

const FamilyStages& dev_stages() { return stages_for(model().weights->config()); }

class DevUpsampleCase : public ::testing::TestWithParam<std::string> {};

// The model opened from its text encoder alone is FLUX.2-dev's (a Mistral language model),
// whose chat under BFL's text-to-image upsampling message is the pipeline's, every [IMG] taken
// out; the pipeline's 2048 ids are its ids after left padding with <pad> (11).
TEST_P(DevUpsampleCase, ChatTextAndIdsAreTheOfficialOnes) {
  const Case c(GetParam());
  EXPECT_EQ(model().weights->config().family, "flux2-dev");
  const UpsampleStyle style = dev_stages().upsample_style();
  UpsampleOptions o;
  const std::string system = upsample_system(o, style);
  EXPECT_EQ(system, c.spec["rendered_chat"].get<std::string>().substr(
                        std::string("<s>[SYSTEM_PROMPT]").size(), system.size()));
  const UpsampleChat chat =
      dev_stages().upsample_chat(model().tokenizer, system, c.spec["prompt"].get<std::string>());
  const std::vector<int32_t> real = c.real_ids();
  EXPECT_EQ(chat.ids, real);
  EXPECT_EQ(int64_t(real.size()), c.spec["prompt_length"].get<int64_t>());
  ASSERT_EQ(c.padded.size(), 2048u);
  const size_t pads = c.padded.size() - real.size();
  for (size_t i = 0; i < c.padded.size(); ++i) {
    EXPECT_EQ(c.mask[i], i >= pads ? 1 : 0) << "slot " << i;  // all on the left
    if (i < pads) {
      EXPECT_EQ(c.padded[i], 11) << "slot " << i;
    }
  }
  EXPECT_EQ(chat.stop, std::vector<int32_t>{2});  // </s>
  EXPECT_TRUE(chat.clean_up_spaces);
  // The pipeline's sampling: temperature 0.15, GenerationConfig's top-k 50, no top-p.
  const qwen3::SamplingOptions s = upsample_sampling(o, style);
  EXPECT_TRUE(s.sample);
  EXPECT_FLOAT_EQ(s.temperature, 0.15f);
  EXPECT_EQ(s.top_k, 50);
  EXPECT_EQ(s.top_p, 1.0f);
}

INSTANTIATE_TEST_SUITE_P(UpsampleMistral, DevUpsampleCase, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param; });

// Largest |a - b| over the largest |b|.
double relative_error(std::span<const float> a, std::span<const float> b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= diff)) diff = d;
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

class DevUpsampleIsa : public ::testing::TestWithParam<std::tuple<std::string, quant::Isa>> {};

// Teacher-forced on the official tokens: the prefill and first step's logits, the top-16
// logits of every step, and the token of every step (greedy: the argmax; sampled: drawn from
// the official support, whose ids and probabilities ours are).
TEST_P(DevUpsampleIsa, LogitsSupportAndTokensOfEveryStep) {
  const quant::Isa isa = std::get<1>(GetParam());
  KLEIN_REQUIRE_ISA(isa);
  const Case c(std::get<0>(GetParam()));
  Compute cx(2, isa);
  const std::vector<int32_t> ids = c.real_ids();
  qwen3::LanguageModel lm(*model().weights, cx, int64_t(ids.size() + c.generated.size()));
  const int64_t vocab = 8192, k = 16;
  const std::vector<float> first = read_npy(c.dir / "logits_first_steps.npy").to_f32();
  ASSERT_EQ(int64_t(first.size()), 2 * vocab);
  const auto topk_ids = read_npy(c.dir / "logits_topk_ids.npy").to_i64();
  const auto topk_values = read_npy(c.dir / "logits_topk_values.npy").to_f32();
  std::vector<int64_t> support_ids;
  std::vector<float> support_probs;
  int64_t support = 0;
  if (!c.greedy()) {
    const NpyArray s = read_npy(c.dir / "sample_support_ids.npy");
    support = s.shape.at(1);
    support_ids = s.to_i64();
    support_probs = read_npy(c.dir / "sample_support_probs.npy").to_f32();
  }
  const qwen3::SamplingOptions sampling{true, 0.15f, 50, 1.0f};

  std::vector<float> logits = lm.prefill(ids);
  ASSERT_EQ(int64_t(logits.size()), vocab);
  EXPECT_LT(relative_error(logits, std::span<const float>(first.data(), size_t(vocab))), 1e-4);
  for (size_t step = 0; step < c.generated.size(); ++step) {
    if (step == 1) {
      EXPECT_LT(relative_error(logits, std::span<const float>(first.data() + vocab, size_t(vocab))),
                1e-4);
    }
    double worst = 0, scale = 0;
    for (int64_t j = 0; j < k; ++j) {
      const float ref = topk_values[step * k + j];
      worst = std::max(worst, std::fabs(double(logits[size_t(topk_ids[step * k + j])]) - ref));
      scale = std::max(scale, std::fabs(double(ref)));
    }
    EXPECT_LT(worst / scale, 1e-4) << "step " << step;
    if (c.greedy()) {
      EXPECT_EQ(qwen3::argmax(logits), c.generated[step]) << "step " << step;
    } else {
      const std::vector<qwen3::Candidate> ours = qwen3::sampling_support(logits, sampling);
      ASSERT_EQ(int64_t(ours.size()), support) << "step " << step;
      // The same ids with the same probabilities; the order too, except between two whose
      // probabilities are within the tolerance of each other (robot_s2's step 45: a near tie
      // that float sums may order either way).
      bool drawn = false;
      for (int64_t j = 0; j < support; ++j) {
        const int64_t want = support_ids[step * support + j];
        const auto it = std::find_if(ours.begin(), ours.end(),
                                     [&](const qwen3::Candidate& x) { return x.id == want; });
        ASSERT_NE(it, ours.end()) << "step " << step << ": official id " << want << " not in ours";
        const float ref = support_probs[step * support + j];
        EXPECT_NEAR(it->prob, ref, 1e-3 * std::max(ref, 1e-3f)) << "step " << step;
        if (ours[size_t(j)].id != want) {
          EXPECT_NEAR(ours[size_t(j)].prob, ref, 2e-3 * std::max(ref, 1e-3f))
              << "step " << step << " rank " << j << ": another id where the official one is";
        }
        drawn = drawn || want == c.generated[step];
      }
      EXPECT_TRUE(drawn) << "step " << step << ": the official draw is outside our support";
    }
    if (step + 1 < c.generated.size()) logits = lm.step(c.generated[step]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    UpsampleMistral, DevUpsampleIsa,
    ::testing::Combine(::testing::ValuesIn(all_cases()),
                       ::testing::ValuesIn(testing::compiled_isas())),
    testing::case_isa_param_name);

// The whole loop as `klein upsample` runs it: greedy (temperature 0) gives the official
// tokens and, decoded without special tokens and cleaned up, the official text; left to the
// family's default it samples, reproducibly for one seed.
TEST(DevUpsample, GreedyLoopDecodesAsTheReferenceAndTheDefaultSamples) {
  Compute cx(2);
  for (const std::string name : {"cat", "img_tag"}) {
    SCOPED_TRACE(name);
    const Case c(name);
    UpsampleOptions o;
    o.temperature = 0.0f;
    o.max_new_tokens = int(c.generated.size());
    const UpsampleResult r = upsample_prompt(model(), cx, c.spec["prompt"].get<std::string>(), o);
    EXPECT_FALSE(r.sampled);
    EXPECT_FALSE(r.stopped);
    EXPECT_EQ(r.new_tokens, int(c.generated.size()));
    EXPECT_EQ(r.prompt_tokens, c.spec["prompt_length"].get<int>());
    EXPECT_EQ(r.prompt, c.spec["upsampled_prompt"].get<std::string>());
  }
  UpsampleOptions o;
  o.max_new_tokens = 12;
  o.seed = 5;
  const UpsampleResult a = upsample_prompt(model(), cx, "a red fox in the snow", o);
  const UpsampleResult b = upsample_prompt(model(), cx, "a red fox in the snow", o);
  EXPECT_TRUE(a.sampled);
  EXPECT_EQ(a.prompt, b.prompt);
}

// `klein upsample --json` with `args` -> its JSON line.
json upsample_json(const std::string& args) { return testing::klein_json("upsample " + args); }

// The command line: FLUX.2-dev's diffusers directory, its text encoder and tokenizer alone, and
// a container converted with --keep-llm give the official greedy answer; one converted without
// it is refused by name; `generate --upsample` on dev samples by default and records the seed.
TEST(DevUpsample, CliFromTheDirectoryTheTextEncoderAndAKeepLlmContainer) {
  const Case c("cat");
  const fs::path out = testing::temp_dir("dev-upsample-cli");
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const std::string args = " -p " + testing::shell_arg(c.spec["prompt"].get<std::string>()) +
                           " --temperature 0 --max-tokens 48 --threads 2";
  const std::string official = c.spec["upsampled_prompt"];
  EXPECT_EQ(upsample_json("-m " + testing::shell_arg(dev) + args).value("prompt", ""), official);
  const json alone = upsample_json("--text-encoder " + testing::shell_arg(model_paths().text_encoder) +
                                   " --tokenizer " + testing::shell_arg(model_paths().tokenizer) + args);
  EXPECT_EQ(alone.value("prompt", ""), official);
  EXPECT_EQ(alone.value("sampling", true), false);
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(dev) + " -t keep --keep-llm -o " +
                                   testing::shell_arg(out / "llm.klein"),
                               &log),
            0)
      << log;
  EXPECT_EQ(upsample_json("-m " + testing::shell_arg(out / "llm.klein") + args).value("prompt", ""),
            official);
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(dev) + " -t keep -o " +
                                   testing::shell_arg(out / "plain.klein"),
                               &log),
            0)
      << log;
  EXPECT_NE(testing::run_klein("upsample -m " + testing::shell_arg(out / "plain.klein") + args, &log), 0);
  EXPECT_NE(log.find("--keep-llm"), std::string::npos) << log;

  ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(dev) +
                                   " -p 'a cat' --upsample --upsample-max-tokens 6 -W 32 -H 32 -s 1 --no-cache "
                                   "--json -o " + testing::shell_arg(out / "up.png"),
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("\"upsample_seed\""), std::string::npos) << "dev samples by default: " << log;
  EXPECT_NE(log.find("\"original_prompt\":\"a cat\""), std::string::npos) << log;
}

// transformers' clean_up_tokenization, replacement by replacement.
TEST(DevUpsample, CleanUpTokenizationIsTransformers) {
  EXPECT_EQ(clean_up_tokenization("Hello , world . Is it ? Yes ! I 'm sure it 's fine , isn 't it"),
            "Hello, world. Is it? Yes! I'm sure it's fine, isn 't it");
  EXPECT_EQ(clean_up_tokenization("they 've and we 're ; don n't"), "they've and we're ; donn't");
  EXPECT_EQ(clean_up_tokenization("a ' b"), "a'b");
  EXPECT_EQ(clean_up_tokenization(" .. "), ".. ");
}

}  // namespace
}  // namespace klein
