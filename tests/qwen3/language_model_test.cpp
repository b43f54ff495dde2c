// Qwen3 as a chat language model against transformers' Qwen3ForCausalLM.generate on the
// tiny models of ../shared/testdata/upsample-tiny (its README lists every file): the chat
// text, the prompt ids, the logits of the prefill and of the first cached step, the greedy
// tokens, the top-64 logits, the sampling support and the draws of every step (these on every
// instruction set), the decoded text. The tied model is opened as the pipeline opens it (the
// klein-tiny diffusers directory); the untied one (Qwen3-8B's layout: its own lm_head) from
// its files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/npy.h"
#include "models/qwen3/generate.h"
#include "models/qwen3/language_model.h"
#include "ops/compute.h"
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

using testing::upsample_dir;

struct Case {
  std::string name;
  json spec;
  std::vector<int32_t> input_ids, generated;
  fs::path dir;

  explicit Case(const std::string& n) : name(n), dir(upsample_dir() / "cases" / n) {
    std::ifstream in(dir / "case.json");
    spec = json::parse(in);
    for (int64_t v : read_npy(dir / "input_ids.npy").to_i64()) input_ids.push_back(int32_t(v));
    for (int64_t v : read_npy(dir / "generated_ids.npy").to_i64()) generated.push_back(int32_t(v));
  }
  bool tied() const { return spec["model"] == "tied"; }
};

// The untied model: its text_encoder files, the units the engine names, its config.
std::unique_ptr<WeightStore> untied_store() {
  const fs::path te = upsample_dir() / "model-untied" / "text_encoder";
  std::ifstream in(te / "config.json");
  ModelConfig config;
  config.text_encoder = parse_text_encoder_config(json::parse(in), "untied config.json", {9, 18, 27});
  return std::make_unique<testing::ComponentFileStore>(te / "model.safetensors.index.json",
                                                       "text_encoder", component_unit_of, config);
}

struct Models {
  std::unique_ptr<WeightStore> tied = open_model(testing::tiny_model());
  std::unique_ptr<WeightStore> untied = untied_store();
  Tokenizer tokenizer = Tokenizer::from_directory(testing::tiny_model() / "tokenizer");
  WeightStore& of(const Case& c) { return c.tied() ? *tied : *untied; }
};

Models& models() {
  static Models m;
  return m;
}

const std::vector<std::string>& all_cases() {
  static const std::vector<std::string> names = {"t2i", "t2i_think", "edit", "non_ascii", "long",
                                                 "t2i_sample_icdf", "untied_eos",
                                                 "untied_sample_torch"};
  return names;
}

// A float64 .npy vector (NumPy format 1.0, '<f8'): the engine's reader has no float64.
std::vector<double> read_f8_npy(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GT(bytes.size(), 10u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8)) << path;
  const size_t header = size_t(uint8_t(bytes[8])) | size_t(uint8_t(bytes[9])) << 8;
  EXPECT_NE(bytes.find("'<f8'"), std::string::npos) << path;
  std::vector<double> out((bytes.size() - 10 - header) / sizeof(double));
  std::memcpy(out.data(), bytes.data() + 10 + header, out.size() * sizeof(double));
  return out;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = std::fabs(double(a[i]) - double(b[i]));
    if (!(x <= d)) d = x;  // NaN fails
  }
  return d;
}

// A sampling case's reference: the support (temperature, top-k, top-p, softmax) of every
// step, and what the official draw picked from it: the inverse-CDF rule with its uniforms, or
// torch's multinomial (argmax of p / q with its exponential variates).
struct SamplingReference {
  qwen3::SamplingOptions options;
  std::vector<int64_t> support_ids, support_size;
  std::vector<float> support_probs, exp_q;
  std::vector<double> uniforms;

  explicit SamplingReference(const Case& c) {
    const json& s = c.spec["sampling"];
    options.sample = true;
    options.temperature = s["temperature"].get<float>();
    options.top_k = s["top_k"].get<int>();
    options.top_p = s["top_p"].get<float>();
    support_ids = read_npy(c.dir / "support_ids.npy").to_i64();
    support_probs = read_npy(c.dir / "support_probs.npy").to_f32();
    support_size = read_npy(c.dir / "support_size.npy").to_i64();
    if (c.spec["mode"] == "sample_icdf")
      uniforms = read_f8_npy(c.dir / "uniforms.npy");
    else
      exp_q = read_npy(c.dir / "exp_q.npy").to_f32();
  }

  // The support of `logits` is the official one of `step`, and the draw picks `token`.
  void check(const std::vector<float>& logits, size_t step, int32_t token) const {
    const auto support = qwen3::sampling_support(logits, options);
    ASSERT_EQ(int64_t(support.size()), support_size[step]) << "step " << step;
    for (size_t j = 0; j < support.size(); ++j) {
      EXPECT_EQ(support[j].id, support_ids[step * 64 + j]) << "step " << step << " rank " << j;
      EXPECT_NEAR(support[j].prob, support_probs[step * 64 + j], 1e-4) << "step " << step;
    }
    int32_t picked = -1;
    if (!uniforms.empty()) {
      picked = qwen3::draw(support, uniforms[step]);
    } else {
      double best = -1;
      for (size_t j = 0; j < support.size(); ++j) {
        const double score = double(support[j].prob) / double(exp_q[step * 64 + j]);
        if (score > best) best = score, picked = support[j].id;
      }
    }
    EXPECT_EQ(picked, token) << "step " << step;
  }
};

class LanguageModelCase : public ::testing::TestWithParam<std::string> {};

TEST_P(LanguageModelCase, ChatTextAndIdsAreTheOfficialOnes) {
  const Case c(GetParam());
  const bool thinking = c.spec["enable_thinking"].is_boolean() && c.spec["enable_thinking"].get<bool>();
  const std::string text = qwen3_chat_text(c.spec["system"].get<std::string>(),
                                           c.spec["user"].get<std::string>(), thinking);
  EXPECT_EQ(text, c.spec["chat_text"].get<std::string>());
  EXPECT_EQ(models().tokenizer.encode(text), c.input_ids);
}

// Every case on every instruction set this CPU has (the others SKIPPED): the logits, and the
// tokens: greedy ones by argmax, sampled ones by the official support and draw of each step.
class LanguageModelIsa
    : public ::testing::TestWithParam<std::tuple<std::string, quant::Isa>> {};

TEST_P(LanguageModelIsa, LogitsAndTokensOfEveryStep) {
  const quant::Isa isa = std::get<1>(GetParam());
  KLEIN_REQUIRE_ISA(isa);
  const Case c(std::get<0>(GetParam()));
  Compute cx(2, isa);
  qwen3::LanguageModel lm(models().of(c), cx, int64_t(c.input_ids.size() + c.generated.size()));
  // The whole-vocabulary logits of steps 0 and 1 (the sampling cases have the top 64 only;
  // t2i_sample_icdf's step 0 is t2i's).
  const fs::path full_file = c.dir / "logits_full.npy";
  const bool has_full = fs::exists(full_file);
  const std::vector<float> ref = has_full ? read_npy(full_file).to_f32() : std::vector<float>();
  const int64_t vocab = models().of(c).config().text_encoder.vocab_size;
  const auto topk_ids = read_npy(c.dir / "topk_ids.npy").to_i64();
  const auto topk_logits = read_npy(c.dir / "topk_logits.npy").to_f32();
  const int64_t k = 64;
  const bool greedy = c.spec["mode"] == "greedy";
  const std::optional<SamplingReference> sampling =
      greedy ? std::nullopt : std::optional<SamplingReference>(c);

  // Teacher-forced on the official tokens: prefill, then one cached step per token.
  std::vector<float> logits = lm.prefill(c.input_ids);
  ASSERT_EQ(int64_t(logits.size()), vocab);
  if (has_full) {
    ASSERT_EQ(int64_t(ref.size()), 2 * vocab);
    EXPECT_LT(max_abs_diff(logits, std::span<const float>(ref.data(), size_t(vocab))), 2e-3);
  }
  for (size_t step = 0; step < c.generated.size(); ++step) {
    if (step == 1 && has_full) {
      EXPECT_LT(max_abs_diff(logits, std::span<const float>(ref.data() + vocab, size_t(vocab))),
                2e-3);
    }
    double worst = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = topk_ids[step * k + j];
      worst = std::max(worst, std::fabs(double(logits[size_t(id)]) -
                                        double(topk_logits[step * k + j])));
    }
    EXPECT_LT(worst, 2e-3) << "step " << step;
    if (greedy) {
      EXPECT_EQ(qwen3::argmax(logits), c.generated[step]) << "step " << step;
    } else {
      sampling->check(logits, step, c.generated[step]);
    }
    if (step + 1 < c.generated.size()) logits = lm.step(c.generated[step]);
  }
}

INSTANTIATE_TEST_SUITE_P(
    UpsampleTiny, LanguageModelIsa,
    ::testing::Combine(::testing::ValuesIn(all_cases()),
                       ::testing::ValuesIn(testing::compiled_isas())),
    testing::case_isa_param_name);

INSTANTIATE_TEST_SUITE_P(UpsampleTiny, LanguageModelCase, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param; });

// The whole loop, greedy: the official tokens, the stop on eos, the decoded text.
TEST(LanguageModel, GreedyGenerationStopsOnEosAndDecodesAsTheReference) {
  for (const std::string name : {"t2i", "untied_eos", "non_ascii"}) {
    SCOPED_TRACE(name);
    const Case c(name);
    Compute cx(2);
    qwen3::LanguageModel lm(models().of(c), cx, 256);
    qwen3::TokenPicker greedy({}, 0);
    const std::vector<int32_t> stop = {151645, 151643};
    const qwen3::GenerationResult r = qwen3::generate(lm, c.input_ids, 32, greedy, stop);
    EXPECT_EQ(r.ids, c.generated);
    EXPECT_EQ(r.stopped, c.spec["stop_reason"] == "eos");
    EXPECT_EQ(models().tokenizer.decode(r.ids, true),
              c.spec["decoded"]["skip_special_tokens"].get<std::string>());
    EXPECT_EQ(models().tokenizer.decode(r.ids, false), c.spec["decoded"]["raw"].get<std::string>());
  }
}

// Our own draw is reproducible: the same seed the same tokens, another seed others.
TEST(LanguageModel, SeededSamplingRepeats) {
  const Case c("t2i");
  Compute cx(2);
  qwen3::SamplingOptions o{true, 0.6f, 20, 0.95f};
  auto run = [&](uint64_t seed) {
    qwen3::LanguageModel lm(models().of(c), cx, 128);
    qwen3::TokenPicker picker(o, seed);
    return qwen3::generate(lm, c.input_ids, 12, picker, {}).ids;
  };
  const auto a = run(7), b = run(7), other = run(8);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
}

TEST(LanguageModel, AContainerWithoutTheLaterLayersIsRefusedByName) {
  const fs::path out = testing::temp_dir("lm-container");
  ASSERT_TRUE(testing::convert_tiny(out / "tiny.klein", "-t q8"));
  const auto store = open_model(out / "tiny.klein");
  std::string missing;
  EXPECT_FALSE(qwen3::can_generate(*store, &missing));
  Compute cx(1);
  const std::string error =
      testing::error_of([&] { qwen3::LanguageModel lm(*store, cx, 16); });
  EXPECT_NE(error.find("cannot run its text encoder as a language model: it has no " + missing),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace klein
