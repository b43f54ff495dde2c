// The Z-Image text conditioning against ../shared/testdata/zimage-tiny: the chat text and ids
// of every prompt of the set (ASCII, CJK with emoji and accents, a negative prompt, the empty
// default negative, one longer than 512 tokens) exactly, and the text encoder's
// hidden_states[-2] of the real tokens within 1e-4 scaled.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "families/zimage/prompt.h"
#include "models/qwen3/text_encoder.h"
#include "support/testing.h"
#include "weights/config.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using testing::zimage_dir;
fs::path vector_path(const std::string& group, const std::string& name) {
  return zimage_dir() / "vectors" / group / name;
}

json prompts() {
  return json::parse(read_text_file(vector_path("tokenizer", "prompts.json")))["prompts"];
}

TEST(ZImagePrompt, ChatTextAndIdsOfEveryPrompt) {
  const Tokenizer tokenizer = Tokenizer::from_directory(zimage_dir() / "model" / "tokenizer");
  const json all = prompts();
  ASSERT_EQ(all.size(), 5u);
  for (const json& p : all) {
    const int index = p["index"].get<int>();
    SCOPED_TRACE("prompt " + std::to_string(index));
    const std::string prompt = p["prompt"].get<std::string>();
    EXPECT_EQ(chat_text(prompt), p["chat_text"].get<std::string>());
    const PromptTokens t = tokenize_prompt(tokenizer, prompt);
    const int n = p["num_tokens"].get<int>();
    ASSERT_EQ(t.real_tokens, n);
    const std::vector<int64_t> ids =
        read_npy(vector_path("tokenizer", "prompt" + std::to_string(index) + "_input_ids.npy"))
            .to_i64();
    for (int i = 0; i < n; ++i) ASSERT_EQ(t.ids[size_t(i)], ids[size_t(i)]) << "token " << i;
    EXPECT_EQ(t.dropped, p["untruncated_length"].get<int>() - n);
    EXPECT_EQ(!t.warning.empty(), p["truncated"].get<bool>());
  }
}

class ZImageText : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const fs::path dir = zimage_dir() / "model" / "text_encoder";
    ModelConfig config;
    config.text_encoder = parse_text_encoder_config(
        json::parse(read_text_file(dir / "config.json")), "text_encoder/config.json");
    EXPECT_EQ(config.text_encoder.output_layers, std::vector<int64_t>{5});
    store_ = std::make_unique<testing::ComponentFileStore>(dir / "model.safetensors.index.json",
                                                           "text_encoder", unit_of, config);
  }
  static void TearDownTestSuite() { store_.reset(); }
  static inline std::unique_ptr<testing::ComponentFileStore> store_;
};

// hidden_states[-2] of the real tokens, for every prompt (the 512-token one included); for
// prompt 0 every hidden state up to it as well.
TEST_F(ZImageText, EncoderGivesTheOfficialEmbeddings) {
  const Tokenizer tokenizer = Tokenizer::from_directory(zimage_dir() / "model" / "tokenizer");
  Compute cx(2);
  qwen3::TextEncoder encoder(*store_, cx);
  EXPECT_EQ(encoder.config().context_dim(), encoder.config().hidden);
  for (const json& p : prompts()) {
    const int index = p["index"].get<int>();
    SCOPED_TRACE("prompt " + std::to_string(index));
    const PromptTokens t = tokenize_prompt(tokenizer, p["prompt"].get<std::string>());
    const std::vector<int32_t> ids(t.ids.begin(), t.ids.begin() + t.real_tokens);
    const std::vector<int32_t> mask(ids.size(), 1);
    std::vector<std::vector<float>> hidden;
    const Tensor embeds = encoder.encode(ids, mask, [&](int64_t, const Tensor& x) {
      if (index == 0) hidden.emplace_back(x.data(), x.data() + x.numel());
    });
    const fs::path ref =
        vector_path("text_encoder", "prompt" + std::to_string(index) + "_embeds.npy");
    EXPECT_EQ(embeds.shape(), read_npy(ref).shape);
    EXPECT_TRUE(testing::matches_npy(embeds, ref, 1e-4));
    if (index != 0) continue;
    // hidden_all: [0] the embeddings, [k] layer k's output, the last (final norm) unused.
    const NpyArray all = read_npy(vector_path("text_encoder", "prompt0_hidden_all.npy"));
    const int64_t n = all.shape[0], per = all.shape[1] * all.shape[2];
    ASSERT_EQ(int64_t(hidden.size()), n - 1);  // the encoder stops after layer n - 2
    const std::vector<float> values = all.to_f32();
    for (int64_t k = 0; k + 1 < n; ++k) {
      SCOPED_TRACE("hidden state " + std::to_string(k));
      EXPECT_LE(testing::scaled_diff(hidden[size_t(k)].data(), values.data() + k * per, per), 1e-4);
    }
  }
}

}  // namespace
}  // namespace klein::zimage
