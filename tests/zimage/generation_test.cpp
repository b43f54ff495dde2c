// Every stage of a Z-Image generation chained, free-running from the official initial noise,
// against the four full ZImagePipeline runs of ../shared/testdata/zimage-tiny (vectors/e2e):
// the prompt's ids, its embedding, the final latents, the decoder's input and output and the
// image in [0, 1], within the set's free-running targets (1e-4 scaled; 5e-4 for the strong-CFG
// case). This is the pipeline in test form, until the engine's pipeline runs the family.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "families/zimage/prompt.h"
#include "models/qwen3/text_encoder.h"
#include "models/vae/decoder.h"
#include "models/zimage/checkpoint/units.h"
#include "models/zimage/latents.h"
#include "models/zimage/sampler.h"
#include "models/zimage/transformer.h"
#include "support/testing.h"
#include "zimage/cases.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path model_dir() { return testing::tiny_dir().parent_path() / "zimage-tiny" / "model"; }
json read_json(const fs::path& p) { return json::parse(read_text_file(p)); }

struct Case {
  const char* name;
  double tolerance;
};

class ZImageGeneration : public ::testing::TestWithParam<Case> {};

TEST_P(ZImageGeneration, MatchesTheOfficialRun) {
  const Case& c = GetParam();
  const fs::path dir = model_dir().parent_path() / "vectors" / "e2e" / c.name;
  const json info = read_json(dir / "case.json");
  Compute cx(2);

  // Text: ids and embeddings of the prompt (and the negative prompt under guidance).
  ModelConfig text_config;
  text_config.text_encoder =
      parse_text_encoder_config(read_json(model_dir() / "text_encoder" / "config.json"), "te");
  testing::ComponentFileStore text_store(
      model_dir() / "text_encoder" / "model.safetensors.index.json", "text_encoder", unit_of,
      text_config);
  const Tokenizer tokenizer = Tokenizer::from_directory(model_dir() / "tokenizer");
  qwen3::TextEncoder encoder(text_store, cx);
  auto encode = [&](const std::string& text, const std::string& stem) {
    const PromptTokens t = tokenize_prompt(tokenizer, text);
    const std::vector<int32_t> ids(t.ids.begin(), t.ids.begin() + t.real_tokens);
    const std::vector<int64_t> want = read_npy(dir / (stem + "_input_ids.npy")).to_i64();
    EXPECT_TRUE(std::equal(ids.begin(), ids.end(), want.begin())) << stem;
    Tensor e = encoder.encode(ids, std::vector<int32_t>(ids.size(), 1));
    const std::string embeds = stem == "prompt" ? "prompt_embeds" : "negative_prompt_embeds";
    EXPECT_TRUE(testing::matches_npy(e, dir / (embeds + ".npy"), 1e-4)) << stem;
    return e;
  };
  const Tensor prompt = encode(info["prompt"].get<std::string>(), "prompt");
  const Guidance g = case_guidance(info);
  Tensor negative;
  if (g.scale > 0) {
    const json n = info.value("negative_prompt", json(nullptr));
    negative = encode(n.is_string() ? n.get<std::string>() : "", "negative");
  }

  // Denoising from the stored noise.
  const TransformerConfig tc =
      parse_transformer_config(read_json(model_dir() / "transformer" / "config.json"), "t");
  testing::ComponentFileStore transformer_store(
      model_dir() / "transformer" / "diffusion_pytorch_model.safetensors", "transformer",
      transformer_unit_of);
  Transformer model(transformer_store, tc);
  const NpyArray noise = read_npy(dir / "noise.npy");
  Tensor x = noise.to_tensor();
  x.reshape({noise.shape[1], noise.shape[2], noise.shape[3]});
  const int64_t H = x.dim(1), W = x.dim(2);
  Activations pos_act(tc, {H, W, prompt.dim(0), tc.patch});
  model.embed_caption(prompt, pos_act, cx);
  std::unique_ptr<Activations> neg_act;
  if (g.scale > 0) {
    neg_act = std::make_unique<Activations>(tc, SequenceLayout{H, W, negative.dim(0), tc.patch});
    model.embed_caption(negative, *neg_act, cx);
  }
  const SchedulerConfig sc = parse_scheduler_config(
      read_json(model_dir() / "scheduler" / "scheduler_config.json"), "scheduler");
  const Schedule s = make_schedule(sc, info["steps"].get<int64_t>());
  Tensor v(x.shape());
  for (int64_t i = 0; i < s.steps(); ++i) {
    const Tensor adaln = model.embed_timestep(s.model_time(i), cx);
    const Tensor pos = model.forward(x, adaln, pos_act, cx);
    const bool guided = guided_at(g, s, i);
    Tensor neg;
    if (guided) neg = model.forward(x, adaln, *neg_act, cx);
    velocity(pos.data(), guided ? neg.data() : nullptr, pos.numel(), g, v.data());
    euler_step(x.data(), v.data(), x.numel(), s.sigmas[size_t(i)], s.sigmas[size_t(i + 1)]);
  }
  EXPECT_TRUE(testing::matches_npy(x, dir / "final_latents.npy", c.tolerance));

  // Decode.
  const json vae_json = read_json(model_dir() / "vae" / "config.json");
  ModelConfig vae_config;
  vae_config.vae = parse_vae_config(vae_json, "vae");
  testing::ComponentFileStore vae_store(model_dir() / "vae" / "diffusion_pytorch_model.safetensors",
                                        "vae", unit_of, vae_config);
  const Tensor z = decoder_input(x, parse_latent_scale(vae_json, "vae"));
  EXPECT_TRUE(testing::matches_npy(z, dir / "vae_input.npy", c.tolerance));
  const Tensor image = vae::run_decoder(*vae_store.acquire("vae.decoder"), vae_config.vae, z, cx);
  EXPECT_TRUE(testing::matches_npy(image, dir / "image_decoded.npy", c.tolerance));
  // The pipeline's output: clamp(x / 2 + 0.5, 0, 1), channels last.
  const int64_t C = image.dim(0), h = image.dim(1), w = image.dim(2);
  Tensor out({h, w, C});
  for (int64_t ch = 0; ch < C; ++ch)
    for (int64_t p = 0; p < h * w; ++p)
      out.data()[p * C + ch] = std::clamp(image.data()[ch * h * w + p] / 2 + 0.5f, 0.0f, 1.0f);
  EXPECT_TRUE(testing::matches_npy(out, dir / "image.npy", c.tolerance));
}

INSTANTIATE_TEST_SUITE_P(OfficialRuns, ZImageGeneration,
                         ::testing::Values(Case{"turbo_h64_w96", 1e-4}, Case{"turbo_h80_w64", 1e-4},
                                           Case{"cfg_h64_w64", 5e-4},
                                           Case{"cfg_norm_trunc_h48_w80", 1e-4}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace klein::zimage
