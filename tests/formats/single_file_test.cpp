// Single-file checkpoints in the original BFL layout (spec b.4): the tiny model's diffusers
// tensors are rewritten under BFL names (fused QKV, swapped final-layer halves, ".scale"
// norms, reversed decoder levels, 1x1 attention convolutions) and must load to exactly the
// same canonical tensors, bit for bit, as the diffusers directory. GGUF files of the same
// tensors: of float types they run as they are; of GGML blocks (Q8_0, Q4_0, made here) they
// must be converted, and then generate what the values of their blocks do.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/files.h"
#include "core/npy.h"
#include "families/flux2_dev/prompt.h"
#include "formats/gguf_files.h"
#include "formats/st_files.h"
#include "support/testing.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"
#include "weights/container_store.h"
#include "weights/model_source.h"
#include "weights/source_store.h"
#include "weights/summary.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using testing::StTensor;
using testing::write_llama_cpp_text_encoder;

using testing::test_name;

using TensorMap = std::map<std::string, StTensor>;

TensorMap by_name(const std::vector<StTensor>& tensors) {
  TensorMap m;
  for (const auto& t : tensors) m[t.name] = t;
  return m;
}

// Takes tensor `name` out of `from` (so that what is left can be checked to be empty).
StTensor take(TensorMap& from, const std::string& name) {
  auto it = from.find(name);
  if (it == from.end()) throw std::runtime_error("tiny model lacks " + name);
  StTensor t = std::move(it->second);
  from.erase(it);
  return t;
}

StTensor renamed(StTensor t, std::string name) {
  t.name = std::move(name);
  return t;
}

// Rows of q, k, v stacked into one [3*D, D] projection (rows of GGML blocks too).
StTensor fused(std::string name, const StTensor& q, const StTensor& k, const StTensor& v) {
  EXPECT_TRUE(k.dtype == q.dtype && v.dtype == q.dtype) << name << ": q, k and v differ in type";
  StTensor t{std::move(name), q.dtype, {3 * q.shape[0], q.shape[1]}, {}};
  for (const StTensor* part : {&q, &k, &v})
    t.bytes.insert(t.bytes.end(), part->bytes.begin(), part->bytes.end());
  return t;
}

// diffusers keeps scale|shift in norm_out, BFL shift|scale.
StTensor halves_swapped(StTensor t, std::string name) {
  const size_t half = t.bytes.size() / 2;
  std::rotate(t.bytes.begin(), t.bytes.begin() + std::ptrdiff_t(half), t.bytes.end());
  t.name = std::move(name);
  return t;
}

struct BflSpelling {
  std::string prefix;          // "" or "model.diffusion_model."
  std::string norm = "scale";  // BFL "scale"; some repacks write "weight"
};

std::vector<StTensor> tiny_transformer() {
  return testing::read_all(testing::tiny_model() /
                           "transformer/diffusion_pytorch_model.safetensors");
}

// The tiny transformer's tensors (`diffusers`: under their diffusers names) under BFL names
// (spec b.4, transformer table). Only whole rows are moved, so the tensors may be GGML blocks.
std::vector<StTensor> bfl_transformer(const BflSpelling& spelling,
                                      const std::vector<StTensor>& diffusers = tiny_transformer()) {
  TensorMap d = by_name(diffusers);
  std::vector<StTensor> out;
  auto put = [&](StTensor t) {
    t.name = spelling.prefix + t.name;
    out.push_back(std::move(t));
  };
  const std::map<std::string, std::string> shared = {
      {"x_embedder.weight", "img_in.weight"},
      {"context_embedder.weight", "txt_in.weight"},
      {"time_guidance_embed.timestep_embedder.linear_1.weight", "time_in.in_layer.weight"},
      {"time_guidance_embed.timestep_embedder.linear_2.weight", "time_in.out_layer.weight"},
      {"double_stream_modulation_img.linear.weight", "double_stream_modulation_img.lin.weight"},
      {"double_stream_modulation_txt.linear.weight", "double_stream_modulation_txt.lin.weight"},
      {"single_stream_modulation.linear.weight", "single_stream_modulation.lin.weight"},
      {"proj_out.weight", "final_layer.linear.weight"},
  };
  for (const auto& [from, to] : shared) put(renamed(take(d, from), to));
  // FLUX.2-dev's guidance embedder (diffusers' convert_flux2_to_diffusers.py: guidance_in).
  const std::string guidance = "time_guidance_embed.guidance_embedder.";
  if (d.count(guidance + "linear_1.weight")) {
    put(renamed(take(d, guidance + "linear_1.weight"), "guidance_in.in_layer.weight"));
    put(renamed(take(d, guidance + "linear_2.weight"), "guidance_in.out_layer.weight"));
  }
  put(halves_swapped(take(d, "norm_out.linear.weight"), "final_layer.adaLN_modulation.1.weight"));
  const std::string norm = "." + spelling.norm;
  for (int i = 0; i < 2; ++i) {
    const std::string p = "transformer_blocks." + std::to_string(i) + ".";
    const std::string b = "double_blocks." + std::to_string(i) + ".";
    const StTensor q = take(d, p + "attn.to_q.weight"), k = take(d, p + "attn.to_k.weight"),
                   v = take(d, p + "attn.to_v.weight");
    put(fused(b + "img_attn.qkv.weight", q, k, v));
    const StTensor aq = take(d, p + "attn.add_q_proj.weight"),
                   ak = take(d, p + "attn.add_k_proj.weight"),
                   av = take(d, p + "attn.add_v_proj.weight");
    put(fused(b + "txt_attn.qkv.weight", aq, ak, av));
    const std::map<std::string, std::string> block = {
        {"attn.norm_q.weight", "img_attn.norm.query_norm" + norm},
        {"attn.norm_k.weight", "img_attn.norm.key_norm" + norm},
        {"attn.norm_added_q.weight", "txt_attn.norm.query_norm" + norm},
        {"attn.norm_added_k.weight", "txt_attn.norm.key_norm" + norm},
        {"attn.to_out.0.weight", "img_attn.proj.weight"},
        {"attn.to_add_out.weight", "txt_attn.proj.weight"},
        {"ff.linear_in.weight", "img_mlp.0.weight"},
        {"ff.linear_out.weight", "img_mlp.2.weight"},
        {"ff_context.linear_in.weight", "txt_mlp.0.weight"},
        {"ff_context.linear_out.weight", "txt_mlp.2.weight"},
    };
    for (const auto& [from, to] : block) put(renamed(take(d, p + from), b + to));
  }
  for (int i = 0; i < 2; ++i) {
    const std::string p = "single_transformer_blocks." + std::to_string(i) + ".attn.";
    const std::string b = "single_blocks." + std::to_string(i) + ".";
    put(renamed(take(d, p + "to_qkv_mlp_proj.weight"), b + "linear1.weight"));
    put(renamed(take(d, p + "to_out.weight"), b + "linear2.weight"));
    put(renamed(take(d, p + "norm_q.weight"), b + "norm.query_norm" + norm));
    put(renamed(take(d, p + "norm_k.weight"), b + "norm.key_norm" + norm));
  }
  EXPECT_TRUE(d.empty()) << "unconverted tensor " << d.begin()->first;
  return out;
}

// The BFL name of a diffusers VAE tensor (spec b.4, VAE table), rules tried in order.
std::string bfl_vae_name(const std::string& n, int levels) {
  static const std::vector<std::pair<std::regex, std::string>> rules = [] {
    std::vector<std::pair<std::regex, std::string>> r;
    auto add = [&](const char* re, const char* to) { r.emplace_back(std::regex(re), to); };
    add(R"(^(encoder|decoder)\.conv_norm_out\.(.*)$)", "$1.norm_out.$2");
    add(R"(^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.conv_shortcut\.(.*)$)",
        "encoder.down.$1.block.$2.nin_shortcut.$3");
    add(R"(^encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$)", "encoder.down.$1.block.$2.$3");
    add(R"(^encoder\.down_blocks\.(\d+)\.downsamplers\.0\.conv\.(.*)$)",
        "encoder.down.$1.downsample.conv.$2");
    add(R"(^(encoder|decoder)\.mid_block\.resnets\.0\.(.*)$)", "$1.mid.block_1.$2");
    add(R"(^(encoder|decoder)\.mid_block\.resnets\.1\.(.*)$)", "$1.mid.block_2.$2");
    add(R"(^(encoder|decoder)\.mid_block\.attentions\.0\.group_norm\.(.*)$)",
        "$1.mid.attn_1.norm.$2");
    add(R"(^(encoder|decoder)\.mid_block\.attentions\.0\.to_(q|k|v)\.(.*)$)",
        "$1.mid.attn_1.$2.$3");
    add(R"(^(encoder|decoder)\.mid_block\.attentions\.0\.to_out\.0\.(.*)$)",
        "$1.mid.attn_1.proj_out.$2");
    add(R"(^quant_conv\.(.*)$)", "encoder.quant_conv.$1");
    add(R"(^post_quant_conv\.(.*)$)", "decoder.post_quant_conv.$1");
    return r;
  }();
  // Decoder levels run the other way: diffusers up_blocks.k is BFL up.(levels-1-k).
  static const std::regex up(
      R"(^decoder\.up_blocks\.(\d+)\.(resnets\.(\d+)\.(.*)|upsamplers\.0\.conv\.(.*))$)");
  std::smatch m;
  if (std::regex_match(n, m, up)) {
    const std::string level = std::to_string(levels - 1 - std::stoi(m[1]));
    if (m[3].matched) {
      std::string rest = m[4];
      if (rest.rfind("conv_shortcut.", 0) == 0) rest = "nin_shortcut." + rest.substr(14);
      return "decoder.up." + level + ".block." + m[3].str() + "." + rest;
    }
    return "decoder.up." + level + ".upsample.conv." + m[5].str();
  }
  for (const auto& [re, to] : rules)
    if (std::regex_match(n, m, re)) return m.format(to);
  return n;  // conv_in, conv_out, bn.*: same names
}

std::vector<StTensor> bfl_vae(const std::string& prefix) {
  std::vector<StTensor> out;
  for (StTensor t :
       testing::read_all(testing::tiny_model() / "vae/diffusion_pytorch_model.safetensors")) {
    const bool attention_linear =
        t.name.find(".attentions.0.to_") != std::string::npos && t.name.ends_with(".weight");
    t.name = prefix + bfl_vae_name(t.name, 4);
    // BFL's attention projections are 1x1 convolutions.
    if (attention_linear) t.shape = {t.shape[0], t.shape[1], 1, 1};
    out.push_back(std::move(t));
  }
  return out;
}

// Every unit of `got` holds exactly the canonical tensors of `want` (at least `at_least` of
// them: the tiny klein has over 500, zimage-tiny 409), bit for bit.
void expect_same_weights(WeightStore& want, WeightStore& got, size_t at_least = 500) {
  ASSERT_EQ(want.units(), got.units());
  size_t compared = 0;
  for (const auto& name : want.units()) {
    UnitRef a = want.acquire(name), b = got.acquire(name);
    ASSERT_EQ(a->weights().size(), b->weights().size()) << name;
    for (const Weight& w : a->weights()) {
      const Weight* x = b->find(w.name.substr(a->prefix().size()));
      ASSERT_NE(x, nullptr) << w.name;
      EXPECT_EQ(x->dtype, w.dtype) << w.name;
      EXPECT_EQ(x->shape, w.shape) << w.name;
      ASSERT_EQ(x->nbytes, w.nbytes) << w.name;
      EXPECT_EQ(std::memcmp(x->data, w.data, w.nbytes), 0) << w.name << " differs";
      ++compared;
    }
  }
  EXPECT_GE(compared, at_least);
}

class BflLayout : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("bfl-" + test_name()); }
  void TearDown() override { fs::remove_all(dir_); }

  // Opens `paths` and the tiny diffusers model and checks that every weight is bit-identical.
  struct Opened {
    std::unique_ptr<WeightStore> single, diffusers;
  };
  static Opened open_and_compare(const ModelPaths& paths) {
    Opened o{open_model(paths), open_model(testing::tiny_model())};
    expect_same_weights(*o.diffusers, *o.single);
    return o;
  }
  // The same, with `file` in place of the tiny model's `part`.
  static Opened open_and_compare(fs::path ModelPaths::*part, const fs::path& file) {
    ModelPaths paths;
    paths.model = testing::tiny_model();
    paths.*part = file;
    return open_and_compare(paths);
  }

  fs::path dir_;
};

TEST_F(BflLayout, TransformerLoadsBitIdentical) {
  testing::write_safetensors(dir_ / "flux-2-klein-tiny.safetensors", bfl_transformer({}));
  const Opened o =
      open_and_compare(&ModelPaths::diffusion_model, dir_ / "flux-2-klein-tiny.safetensors");
  // No config.json came with the file: the shapes must give the same configuration.
  const TransformerConfig& a = o.diffusers->config().transformer;
  const TransformerConfig& b = o.single->config().transformer;
  EXPECT_EQ(b.num_double_blocks, a.num_double_blocks);
  EXPECT_EQ(b.num_single_blocks, a.num_single_blocks);
  EXPECT_EQ(b.num_heads, a.num_heads);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_EQ(b.context_dim, a.context_dim);
  EXPECT_EQ(b.mlp_ratio, a.mlp_ratio);
  EXPECT_EQ(b.rope_axes, a.rope_axes);
}

// FLUX.2-dev's transformer as BFL publishes it (flux2-dev.safetensors: the klein names plus
// guidance_in): detected as dev by its guidance embedder, with or without the directory, and
// as a GGUF of the same names.
TEST_F(BflLayout, DevTransformerLoadsBitIdenticalAndIsDetectedAsDev) {
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const std::vector<StTensor> diffusers =
      testing::read_all(dev / "transformer" / "diffusion_pytorch_model.safetensors");
  for (const std::string prefix : {"", "model.diffusion_model."}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    testing::write_safetensors(dir_ / "flux2-dev.safetensors", bfl_transformer({prefix}, diffusers));
    ModelPaths with_directory;
    with_directory.model = dev;
    with_directory.diffusion_model = dir_ / "flux2-dev.safetensors";
    ModelPaths files_only;
    files_only.diffusion_model = dir_ / "flux2-dev.safetensors";
    files_only.text_encoder = dev / "text_encoder" / "model.safetensors.index.json";
    files_only.vae = dev / "vae" / "diffusion_pytorch_model.safetensors";
    const auto want = open_model(dev);
    for (const ModelPaths* paths : {&with_directory, &files_only}) {
      const auto got = open_model(*paths);
      EXPECT_EQ(got->config().family, "flux2-dev");
      EXPECT_TRUE(got->config().transformer.guidance_embeds);
      expect_same_weights(*want, *got, 100);
    }
    // The same tensors as a GGUF (city96's FLUX.2-dev GGUFs keep BFL's names).
    testing::write_gguf(dir_ / "flux2-dev-BF16.gguf", {{"general.architecture", std::string("flux")}},
                        bfl_transformer({prefix}, diffusers));
    files_only.diffusion_model = dir_ / "flux2-dev-BF16.gguf";
    const auto got = open_model(files_only);
    EXPECT_EQ(got->config().family, "flux2-dev");
    expect_same_weights(*want, *got, 100);
  }
}

// ComfyUI's FLUX.2-dev text encoder (mistral_3_small_flux2_*.safetensors): the language
// model alone under "model.", only the 30 layers the pipeline reads (no final norm, no head),
// and Mistral's tekken.json in a U8 tensor "tekken_model". With no tokenizer given, that
// tensor is the tokenizer (tools/tekken/tekken_json.py writes the test tokenizer as one), and
// the run is the diffusers directory's, pixel for pixel. Its configuration comes from a
// config.json beside it, or from -m's text_encoder/ when it replaces -m's text encoder.
TEST_F(BflLayout, ComfyMistralFileWithItsTekkenTokenizerGeneratesAsTheDirectory) {
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const fs::path tekken = dir_ / "tekken.json";
  const std::string cmd =
      "/usr/bin/python3 " +
      testing::shell_arg(fs::path(KLEIN_SOURCE_DIR) / "tools" / "tekken" / "tekken_json.py") + " " +
      testing::shell_arg(dev / "tokenizer" / "tokenizer.json") + " " + testing::shell_arg(tekken);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<StTensor> comfy;
  const std::regex layer(R"(^model\.layers\.(\d+)\.)");
  for (StTensor t : testing::read_all(dev / "text_encoder" / "model.safetensors.index.json")) {
    if (!t.name.starts_with("language_model.model.")) continue;  // vision tower, projector, head
    t.name = t.name.substr(std::string("language_model.").size());
    std::smatch m;
    if (t.name == "model.norm.weight") continue;
    if (std::regex_search(t.name, m, layer) && std::stoi(m[1]) >= 30) continue;
    comfy.push_back(std::move(t));
  }
  ASSERT_EQ(comfy.size(), 1u + 30u * 9u);
  const std::string text = read_text_file(tekken);
  StTensor tok{"tekken_model", "U8", {int64_t(text.size())}, {}};
  for (char c : text) tok.bytes.push_back(std::byte(c));
  comfy.push_back(std::move(tok));
  const fs::path beside = dir_ / "beside";
  fs::create_directories(beside);
  testing::write_safetensors(beside / "mistral_3_small_flux2_bf16.safetensors", comfy);
  fs::copy_file(dev / "text_encoder" / "config.json", beside / "config.json");
  const fs::path alone = dir_ / "alone";
  fs::create_directories(alone);
  fs::copy_file(beside / "mistral_3_small_flux2_bf16.safetensors",
                alone / "mistral_3_small_flux2_bf16.safetensors");

  ModelPaths files;
  files.diffusion_model = dev / "transformer" / "diffusion_pytorch_model.safetensors";
  files.text_encoder = beside / "mistral_3_small_flux2_bf16.safetensors";
  files.vae = dev / "vae" / "diffusion_pytorch_model.safetensors";
  EXPECT_EQ(tokenizer_source(files).kind, TokenizerSource::Kind::Tekken);
  {
    const auto got = open_model(files);
    EXPECT_EQ(got->config().family, "flux2-dev");
    EXPECT_EQ(got->config().text_encoder.num_layers, 40);  // what config.json says
    // Every weight it has is the directory's, bit for bit (the directory has 10 layers more).
    const auto want = open_model(dev);
    size_t compared = 0;
    for (const std::string& unit : got->units()) {
      if (!unit.starts_with("text_encoder.")) continue;
      const UnitRef a = want->acquire(unit), b = got->acquire(unit);
      ASSERT_EQ(a->weights().size(), b->weights().size()) << unit;
      for (const Weight& w : b->weights()) {
        const Weight* x = a->find(w.name.substr(b->prefix().size()));
        ASSERT_NE(x, nullptr) << w.name;
        ASSERT_EQ(x->nbytes, w.nbytes) << w.name;
        EXPECT_EQ(std::memcmp(x->data, w.data, w.nbytes), 0) << w.name;
        ++compared;
      }
    }
    EXPECT_EQ(compared, 1u + 30u * 9u);
  }

  const std::string run = " -p \"a red cube, 2 of them\" -s 2 -W 64 -H 64 --seed 3 --no-cache -q";
  std::string log;
  auto generate = [&](const std::string& model, const std::string& name) {
    EXPECT_EQ(testing::run_klein("generate " + model + run + " --dump " + (dir_ / name).string() +
                                     " -o " + (dir_ / (name + ".png")).string(),
                                 &log), 0)
        << log;
  };
  generate("-m " + dev.string(), "directory");
  generate("--diffusion-model " + files.diffusion_model.string() + " --vae " + files.vae.string() +
               " --text-encoder " + files.text_encoder.string(),
           "comfy");
  generate("-m " + dev.string() + " --text-encoder " +
               (alone / "mistral_3_small_flux2_bf16.safetensors").string(),
           "comfy-in-m");
  for (const char* f : {"prompt_embeds.npy", "final_latents.npy", "image.npy"}) {
    EXPECT_EQ(read_text_file(dir_ / "comfy" / f), read_text_file(dir_ / "directory" / f)) << f;
    EXPECT_EQ(read_text_file(dir_ / "comfy-in-m" / f), read_text_file(dir_ / "directory" / f)) << f;
  }
  // The prefixes other repacks put before the language model load to the same weights.
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"model.", "text_encoder.model."}, {"model.", "language_model."}}) {
    SCOPED_TRACE(to);
    std::vector<StTensor> renamed = comfy;
    for (StTensor& t : renamed)
      if (t.name.starts_with(from)) t.name = to + t.name.substr(from.size());
    const fs::path other = beside / "prefixed.safetensors";
    testing::write_safetensors(other, renamed);
    ModelPaths p = files;
    p.text_encoder = other;
    const auto a = open_model(files), b = open_model(p);
    ASSERT_EQ(a->units(), b->units());
    for (const std::string& unit : a->units()) {
      if (!unit.starts_with("text_encoder.")) continue;
      const UnitRef ua = a->acquire(unit), ub = b->acquire(unit);
      ASSERT_EQ(ua->weights().size(), ub->weights().size()) << unit;
      for (const Weight& w : ua->weights()) {
        const Weight* x = ub->find(w.name.substr(ua->prefix().size()));
        ASSERT_NE(x, nullptr) << w.name;
        EXPECT_EQ(std::memcmp(x->data, w.data, w.nbytes), 0) << w.name;
      }
    }
  }

  // Mistral's tekken.json in a --tokenizer directory (mistralai's repositories ship it).
  const fs::path tok_dir = dir_ / "tekken-only";
  fs::create_directories(tok_dir);
  fs::copy_file(tekken, tok_dir / "tekken.json");
  ModelPaths with_dir = files;
  with_dir.tokenizer = tok_dir;
  EXPECT_EQ(tokenizer_source(with_dir).kind, TokenizerSource::Kind::Directory);
  const Tokenizer from_dir(read_tokenizer_files(with_dir).files());
  const Tokenizer official = Tokenizer::from_directory(dev / "tokenizer");
  const std::string prompt = "[INST]Ein Fuchs im Schnee, 2024 \xC3\xA9t\xC3\xA9[/INST]";
  EXPECT_EQ(from_dir.encode(prompt), official.encode(prompt));
  EXPECT_TRUE(from_dir.pads_left());

  // Without any configuration the head width cannot be measured (Mistral has no per-head
  // norm); the real model's 128 is assumed, and the tiny model's 16 gives a clear error.
  ModelPaths bare = files;
  bare.text_encoder = alone / "mistral_3_small_flux2_bf16.safetensors";
  const std::string e = testing::error_of([&] { open_model(bare); });
  EXPECT_THAT(e, ::testing::HasSubstr("mistral_3_small_flux2_bf16.safetensors"));
  EXPECT_THAT(e, ::testing::HasSubstr("config.json"));
}

// A Mistral text encoder as llama.cpp writes it (the GGUFs of Mistral Small 3.1:
// architecture llama or mistral3, llama.cpp's names, the q/k rows of each head interleaved by
// its converter, Mistral's Tekken tokenizer in the metadata as tokenizer.ggml.pre "tekken").
// Here the tiny Mistral with its rows interleaved by the test as gguf-py's LlamaModel.permute
// does (rows as (heads, 2, head_dim / 2), the two inner axes swapped): it must load to the
// directory's weights bit for bit, tokenize as the directory's tokenizer.json with the Tekken
// pattern, and generate the directory's image.
TEST_F(BflLayout, LlamaCppMistralLoadsTokenizesAndGeneratesAsTheDirectory) {
  const fs::path dev = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const nlohmann::json text_config =
      nlohmann::json::parse(read_text_file(dev / "text_encoder" / "config.json"))["text_config"];
  const int64_t heads = text_config["num_attention_heads"], kv_heads = text_config["num_key_value_heads"],
                head_dim = text_config["head_dim"];
  const std::map<std::string, std::string> layer_names = {
      {"self_attn.q_proj.weight", "attn_q.weight"},       {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},       {"self_attn.o_proj.weight", "attn_output.weight"},
      {"input_layernorm.weight", "attn_norm.weight"},     {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},        {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  // Row h * hd + 2i + j of the file is row h * hd + j * hd / 2 + i of transformers'.
  auto interleaved = [](StTensor t, int64_t n) {
    const size_t row = t.bytes.size() / size_t(t.shape[0]);
    const int64_t hd = t.shape[0] / n;
    std::vector<std::byte> out(t.bytes.size());
    for (int64_t h = 0; h < n; ++h)
      for (int64_t i = 0; i < hd / 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          std::memcpy(out.data() + size_t(h * hd + 2 * i + j) * row,
                      t.bytes.data() + size_t(h * hd + j * (hd / 2) + i) * row, row);
    t.bytes = std::move(out);
    return t;
  };
  std::vector<StTensor> tensors;
  const std::regex layer(R"(^language_model\.model\.layers\.(\d+)\.(.+)$)");
  for (StTensor t : testing::read_all(dev / "text_encoder" / "model.safetensors.index.json")) {
    std::smatch m;
    if (t.name == "language_model.model.embed_tokens.weight") {
      t.name = "token_embd.weight";
    } else if (t.name == "language_model.model.norm.weight") {
      t.name = "output_norm.weight";
    } else if (t.name == "language_model.lm_head.weight") {
      t.name = "output.weight";
    } else if (std::regex_match(t.name, m, layer)) {
      const std::string block = m[1], rest = m[2];
      if (rest == "self_attn.q_proj.weight") t = interleaved(std::move(t), heads);
      if (rest == "self_attn.k_proj.weight") t = interleaved(std::move(t), kv_heads);
      t.name = "blk." + block + "." + layer_names.at(rest);
    } else {
      continue;  // the vision tower and the projector, which llama.cpp's converter drops
    }
    tensors.push_back(std::move(t));
  }
  ASSERT_EQ(tensors.size(), 3u + 40u * 9u);
  // The tokenizer as llama.cpp stores it: tokens by id, control tokens typed 3, merges "a b".
  const nlohmann::json tok = nlohmann::json::parse(read_text_file(dev / "tokenizer" / "tokenizer.json"));
  std::vector<std::string> tokens(tok["model"]["vocab"].size());
  for (const auto& [text, id] : tok["model"]["vocab"].items()) tokens.at(id.get<size_t>()) = text;
  std::vector<int32_t> types(tokens.size(), 1);
  for (const auto& a : tok["added_tokens"]) types.at(a["id"].get<size_t>()) = a["special"].get<bool>() ? 3 : 4;
  std::vector<std::string> merges;
  for (const auto& m : tok["model"]["merges"])
    merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
  auto metadata = [&](const std::string& arch, const std::string& pre) {
    return std::vector<testing::GgufKey>{
        {"general.architecture", arch},
        {arch + ".attention.head_count", uint32_t(heads)},
        {arch + ".attention.head_count_kv", uint32_t(kv_heads)},
        {arch + ".attention.key_length", uint32_t(head_dim)},
        {arch + ".rope.freq_base", 1e9f},
        {"tokenizer.ggml.model", std::string("gpt2")},
        {"tokenizer.ggml.pre", pre},
        {"tokenizer.ggml.tokens", tokens},
        {"tokenizer.ggml.token_type", types},
        {"tokenizer.ggml.merges", merges}};
  };
  const fs::path gguf = dir_ / "Mistral-Small-3.1-24B-Instruct-2503-BF16.gguf";
  testing::write_gguf(gguf, metadata("llama", "tekken"), tensors);

  ModelPaths files;
  files.diffusion_model = dev / "transformer" / "diffusion_pytorch_model.safetensors";
  files.text_encoder = gguf;
  files.vae = dev / "vae" / "diffusion_pytorch_model.safetensors";
  {
    const auto got = open_model(files);
    const TextEncoderConfig& e = got->config().text_encoder;
    EXPECT_EQ(got->config().family, "flux2-dev");
    EXPECT_FALSE(e.qk_norm);
    EXPECT_EQ(e.head_dim, head_dim);  // from attention.key_length: no config.json here
    EXPECT_EQ(e.num_heads, heads);
    EXPECT_EQ(e.num_kv_heads, kv_heads);
    EXPECT_EQ(e.rope_theta, 1e9);
    EXPECT_EQ(e.rms_eps, 1e-5);
    const auto want = open_model(dev);
    size_t compared = 0;
    for (const std::string& unit : got->units()) {
      if (!unit.starts_with("text_encoder.")) continue;
      const UnitRef a = want->acquire(unit), b = got->acquire(unit);
      for (const Weight& w : b->weights()) {
        const Weight* x = a->find(w.name.substr(b->prefix().size()));
        ASSERT_NE(x, nullptr) << w.name;
        ASSERT_EQ(x->nbytes, w.nbytes) << w.name;
        EXPECT_EQ(std::memcmp(x->data, w.data, w.nbytes), 0) << w.name << " differs";
        ++compared;
      }
    }
    EXPECT_GE(compared, 1u + 30u * 9u);
  }

  // The tokenizer: the directory's tokenizer.json with the Tekken pattern in its Split.
  EXPECT_EQ(tokenizer_source(files).kind, TokenizerSource::Kind::Gguf);
  const Tokenizer from_gguf(read_tokenizer_files(files).files());
  nlohmann::json with_tekken = tok;
  with_tekken["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kTekkenPattern;
  TokenizerBytes reference;
  reference.origin = "tokenizer.json with the Tekken pattern";
  reference.tokenizer_json = with_tekken.dump();
  const Tokenizer want_tok(reference.files());
  const Tokenizer directory = Tokenizer::from_directory(dev / "tokenizer");
  const nlohmann::json vectors =
      nlohmann::json::parse(read_text_file(dev.parent_path() / "tokenizer_vectors.json"));
  for (const auto& c : vectors["strings"])
    EXPECT_EQ(from_gguf.encode(c["text"].get<std::string>()), want_tok.encode(c["text"].get<std::string>()))
        << c["text"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXPECT_NE(from_gguf.encode("HelloWorld 2024"), directory.encode("HelloWorld 2024"));  // the pattern
  EXPECT_TRUE(from_gguf.pads_left());
  EXPECT_EQ(from_gguf.token_id("[SYSTEM_PROMPT]"), 17);
  // This prompt splits alike under both patterns, so the run must be the directory's.
  const std::string prompt = "a red cube";
  ASSERT_EQ(from_gguf.encode(dev_chat_text(prompt)), directory.encode(dev_chat_text(prompt)));
  const std::string run = " -p \"" + prompt + "\" -s 2 -W 64 -H 64 --seed 5 --no-cache -q";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate -m " + dev.string() + run + " --dump " + (dir_ / "st").string() +
                                   " -o " + (dir_ / "st.png").string(),
                               &log), 0) << log;
  ASSERT_EQ(testing::run_klein("generate --diffusion-model " + files.diffusion_model.string() + " --vae " +
                                   files.vae.string() + " --text-encoder " + gguf.string() + run +
                                   " --dump " + (dir_ / "gguf").string() + " -o " + (dir_ / "gguf.png").string(),
                               &log), 0) << log;
  for (const char* f : {"prompt_embeds.npy", "final_latents.npy", "image.npy"})
    EXPECT_EQ(read_text_file(dir_ / "gguf" / f), read_text_file(dir_ / "st" / f)) << f;
  // Converted, the same container as the directory's (weights, tokenizer and all): the same run.
  ASSERT_EQ(testing::run_klein("convert -m " + dev.string() + " -t q8 -q -o " + (dir_ / "st.klein").string(), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein("convert --diffusion-model " + files.diffusion_model.string() + " --vae " +
                                   files.vae.string() + " --text-encoder " + gguf.string() + " -t q8 -q -o " +
                                   (dir_ / "gguf.klein").string(),
                               &log), 0) << log;
  for (const char* name : {"st", "gguf"})
    ASSERT_EQ(testing::run_klein("generate -m " + (dir_ / (std::string(name) + ".klein")).string() + run +
                                     " --dump " + (dir_ / (std::string(name) + "-q8")).string() + " -o " +
                                     (dir_ / (std::string(name) + "-q8.png")).string(),
                                 &log), 0) << log;
  for (const char* f : {"prompt_embeds.npy", "final_latents.npy", "image.npy"})
    EXPECT_EQ(read_text_file(dir_ / "gguf-q8" / f), read_text_file(dir_ / "st-q8" / f)) << f;

  // Another architecture, or another pre-tokenizer of a Mistral, is refused by name.
  testing::write_gguf(dir_ / "other.gguf", metadata("gemma3", "tekken"), tensors);
  files.text_encoder = dir_ / "other.gguf";
  EXPECT_THAT(testing::error_of([&] { open_model(files); }),
              ::testing::HasSubstr("general.architecture is \"gemma3\""));
  testing::write_gguf(dir_ / "pre.gguf", metadata("mistral3", "llama-bpe"), tensors);
  files.text_encoder = dir_ / "pre.gguf";
  EXPECT_THAT(testing::error_of([&] { read_tokenizer_files(files); }),
              ::testing::HasSubstr("tokenizer.ggml.pre is \"llama-bpe\""));
}

TEST_F(BflLayout, ComfyPrefixAndWeightSpelledNormsLoadBitIdentical) {
  testing::write_safetensors(dir_ / "comfy.safetensors",
                             bfl_transformer({"model.diffusion_model.", "weight"}));
  open_and_compare(&ModelPaths::diffusion_model, dir_ / "comfy.safetensors");
}

TEST_F(BflLayout, VaeLoadsBitIdentical) {
  for (const std::string prefix : {"", "first_stage_model."}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    testing::write_safetensors(dir_ / "ae.safetensors", bfl_vae(prefix));
    const Opened o = open_and_compare(&ModelPaths::vae, dir_ / "ae.safetensors");
    const VaeConfig& a = o.diffusers->config().vae;
    const VaeConfig& b = o.single->config().vae;
    EXPECT_EQ(b.block_out_channels, a.block_out_channels);
    EXPECT_EQ(b.decoder_channels(), a.decoder_channels());
    EXPECT_EQ(b.layers_per_block, a.layers_per_block);
    EXPECT_EQ(b.latent_channels, a.latent_channels);
    EXPECT_EQ(b.mid_block_attention, a.mid_block_attention);
  }
}

TEST_F(BflLayout, EverythingFromSingleFiles) {
  testing::write_safetensors(dir_ / "t.safetensors", bfl_transformer({"model.diffusion_model."}));
  testing::write_safetensors(dir_ / "ae.safetensors", bfl_vae(""));
  ModelPaths paths;
  paths.diffusion_model = dir_ / "t.safetensors";
  paths.text_encoder = testing::tiny_model() / "text_encoder/model.safetensors.index.json";
  paths.vae = dir_ / "ae.safetensors";
  open_and_compare(paths);
}

TEST_F(BflLayout, SummaryReportsTheLayoutAndTheFileTensors) {
  testing::write_safetensors(dir_ / "t.safetensors", bfl_transformer({}));
  testing::write_safetensors(dir_ / "ae.safetensors", bfl_vae(""));
  ModelPaths paths;
  paths.model = testing::tiny_model();
  paths.diffusion_model = dir_ / "t.safetensors";
  paths.vae = dir_ / "ae.safetensors";
  const ModelSummary s = describe_model(paths);
  ASSERT_EQ(s.components.size(), 3u);
  const ComponentSummary& t = s.components[0];
  EXPECT_EQ(t.layout, Layout::Bfl);
  EXPECT_TRUE(t.config_file.empty());
  // Each double block holds two fused QKV tensors in place of six projections.
  EXPECT_EQ(t.counts.tensors, 49 - 2 * 4);
  int64_t unit_tensors = 0, unit_parameters = 0;
  for (const auto& u : t.units) {
    unit_tensors += u.counts.tensors;
    unit_parameters += u.counts.parameters;
  }
  EXPECT_EQ(unit_tensors, 49);
  EXPECT_EQ(unit_parameters, t.counts.parameters);
  EXPECT_EQ(s.components[1].layout, Layout::Diffusers);
  EXPECT_EQ(s.components[2].layout, Layout::Bfl);
  EXPECT_EQ(s.components[2].counts.tensors, 247);
}

// --- GGUF files of the same tensors (F32/F16/BF16, which run without converting) ---------

TEST_F(BflLayout, GgufTransformerLoadsBitIdentical) {
  // stable-diffusion.cpp's prefix; ComfyUI-GGUF writes the names without it.
  testing::write_gguf(dir_ / "t.gguf", {{"general.architecture", std::string("flux")}},
                      bfl_transformer({"model.diffusion_model.", "scale"}));
  open_and_compare(&ModelPaths::diffusion_model, dir_ / "t.gguf");
}

TEST_F(BflLayout, GgufTensorsStoredFlattenedTakeTheirRecordedShape) {
  // ComfyUI-GGUF stores a matrix whose rows are not whole blocks of 256 as rows of 256 and
  // records the original shape (torch order) in comfy.gguf.orig_shape.NAME.
  std::vector<StTensor> tensors = bfl_transformer({});
  std::vector<testing::GgufKey> meta;
  for (StTensor& t : tensors)
    if (t.name == "img_in.weight") {  // [256, 128]
      std::vector<int32_t> orig(t.shape.begin(), t.shape.end());
      meta.push_back({"comfy.gguf.orig_shape." + t.name, orig});
      t.shape = {numel(t.shape) / 256, 256};
    }
  ASSERT_EQ(meta.size(), 1u);
  testing::write_gguf(dir_ / "t.gguf", meta, tensors);
  open_and_compare(&ModelPaths::diffusion_model, dir_ / "t.gguf");
}

TEST_F(BflLayout, GgufTextEncoderLoadsBitIdenticalWithItsTokenizer) {
  write_llama_cpp_text_encoder(dir_ / "te.gguf");
  open_and_compare(&ModelPaths::text_encoder, dir_ / "te.gguf");
  // Without -m or --tokenizer the tokenizer comes from the metadata: the files Qwen3 ships.
  const fs::path m = testing::tiny_model();
  ModelPaths paths;
  paths.diffusion_model = m / "transformer/diffusion_pytorch_model.safetensors";
  paths.text_encoder = dir_ / "te.gguf";
  paths.vae = m / "vae/diffusion_pytorch_model.safetensors";
  const TokenizerBytes b = read_tokenizer_files(paths);
  ASSERT_TRUE(b.vocab_json && b.merges_txt && b.tokenizer_config_json);
  EXPECT_EQ(nlohmann::json::parse(*b.vocab_json), nlohmann::json::parse(read_text_file(m / "tokenizer/vocab.json")));
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    for (size_t at = 0; at < text.size();) {
      size_t end = text.find('\n', at);
      if (end == std::string::npos) end = text.size();
      if (end > at && text[at] != '#') out.push_back(text.substr(at, end - at));
      at = end + 1;
    }
    return out;
  };
  EXPECT_EQ(lines(*b.merges_txt), lines(read_text_file(m / "tokenizer/merges.txt")));
  const auto want = nlohmann::json::parse(read_text_file(m / "tokenizer/tokenizer_config.json"))["added_tokens_decoder"];
  const auto got = nlohmann::json::parse(*b.tokenizer_config_json)["added_tokens_decoder"];
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [id, t] : want.items()) {
    EXPECT_EQ(got[id]["content"], t["content"]) << id;
    EXPECT_EQ(got[id]["special"], t["special"]) << id;
  }
}

TEST_F(BflLayout, GgufOfFloatTypesGeneratesAsTheSafetensors) {
  // Straight from the GGUF files, no conversion, no --tokenizer: the same latents.
  testing::write_gguf(dir_ / "t.gguf", {}, bfl_transformer({}));
  write_llama_cpp_text_encoder(dir_ / "te.gguf");
  const std::string run = " -p \"a red cube\" -s 2 -W 64 -H 64 --seed 3 --no-cache --threads 2 -q";
  const fs::path m = testing::tiny_model();
  std::string log;
  ASSERT_EQ(testing::run_klein("generate --diffusion-model " + (dir_ / "t.gguf").string() + " --text-encoder " +
                                   (dir_ / "te.gguf").string() + " --vae " +
                                   (m / "vae/diffusion_pytorch_model.safetensors").string() +
                                   " --variant 4b" + run + " --dump " + (dir_ / "gguf").string() + " -o " +
                                   (dir_ / "gguf.png").string(),
                               &log), 0) << log;
  ASSERT_EQ(testing::run_klein("generate -m " + m.string() + run + " --dump " + (dir_ / "st").string() +
                                   " -o " + (dir_ / "st.png").string(),
                               &log), 0) << log;
  for (const char* f : {"prompt_embeds.npy", "final_latents.npy", "image.npy"})
    EXPECT_EQ(read_text_file(dir_ / "gguf" / f), read_text_file(dir_ / "st" / f)) << f;
}

// --- GGUF files of GGML blocks (Q8_0, Q4_0), which run only after converting ------------------

// The blocks are made and read back here with GGML's formulas rather than by the engine, so
// that the engine's reading of them is checked against an independent decoding.

constexpr int64_t kBlock = 32;  // values per Q8_0 / Q4_0 block

// The values of a BF16 or F32 tensor.
std::vector<float> values_of(const StTensor& t) {
  std::vector<float> v(size_t(numel(t.shape)));
  if (t.dtype == "F32") {
    std::memcpy(v.data(), t.bytes.data(), v.size() * 4);
    return v;
  }
  EXPECT_EQ(t.dtype, "BF16") << t.name;
  for (size_t i = 0; i < v.size(); ++i) {
    const uint32_t bits = uint32_t(t.bytes[2 * i]) | uint32_t(t.bytes[2 * i + 1]) << 8;
    const uint32_t f32 = bits << 16;
    std::memcpy(&v[i], &f32, 4);
  }
  return v;
}

StTensor f32_tensor(const StTensor& like, const std::vector<float>& v) {
  StTensor t{like.name, "F32", like.shape, std::vector<std::byte>(v.size() * 4)};
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

// IEEE binary16 to float32, exactly (a block's scale d).
float half_to_float(std::byte lo, std::byte hi) {
  const uint32_t h = uint32_t(lo) | uint32_t(hi) << 8;
  const int exponent = int(h >> 10) & 31;
  const float mantissa = float(h & 1023);
  const float v = exponent == 0    ? std::ldexp(mantissa, -24)
                  : exponent == 31 ? (mantissa != 0 ? NAN : INFINITY)
                                   : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -v : v;
}

// The values of `t` as GGML blocks of `type`, block after block along each row: Q8_0 with
// d = amax / 127 and q = round(x / d); Q4_0 as ggml's reference quantizer, d = m / -8 for the
// value m of largest magnitude and q = min(15, int(x / d + 8.5)).
StTensor quantized(const StTensor& t, const std::string& type) {
  const std::vector<float> v = values_of(t);
  const bool q8 = type == "Q8_0";
  StTensor q{t.name, type, t.shape, {}};
  q.bytes.reserve(v.size() / kBlock * (q8 ? 34 : 18));
  for (size_t at = 0; at < v.size(); at += kBlock) {
    const float* x = v.data() + at;
    float amax = 0, max = 0;
    for (int64_t j = 0; j < kBlock; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = q8 ? amax / 127 : max / -8;
    const float id = d != 0 ? 1 / d : 0;
    const uint16_t dh = f32_to_f16(d);
    q.bytes.push_back(std::byte(dh & 0xff));
    q.bytes.push_back(std::byte(dh >> 8));
    if (q8) {
      for (int64_t j = 0; j < kBlock; ++j)
        q.bytes.push_back(std::byte(int8_t(std::clamp(std::lround(x[j] * id), -127L, 127L))));
    } else {
      auto code = [&](float x) { return std::clamp(int(x * id + 8.5f), 0, 15); };
      for (int64_t j = 0; j < kBlock / 2; ++j)
        q.bytes.push_back(std::byte(code(x[j]) | code(x[j + kBlock / 2]) << 4));
    }
  }
  return q;
}

// The float32 values GGML blocks stand for: d times the code (Q8_0: the int8 q; Q4_0: the
// nibble minus 8, value j in the low nibble of byte j and value j + 16 in its high nibble).
StTensor decoded(const StTensor& q) {
  const bool q8 = q.dtype == "Q8_0";
  const size_t block_bytes = q8 ? 34 : 18;
  std::vector<float> v;
  v.reserve(q.bytes.size() / block_bytes * kBlock);
  for (size_t at = 0; at < q.bytes.size(); at += block_bytes) {
    const std::byte* b = q.bytes.data() + at;
    const float d = half_to_float(b[0], b[1]);
    if (q8) {
      for (int64_t j = 0; j < kBlock; ++j) v.push_back(d * float(int8_t(b[2 + j])));
    } else {
      for (int64_t j = 0; j < kBlock; ++j) {
        const int nibble =
            j < kBlock / 2 ? int(b[2 + j] & std::byte{15}) : int(b[2 + j - kBlock / 2] >> 4);
        v.push_back(d * float(nibble - 8));
      }
    }
  }
  return f32_tensor(q, v);
}

// A tensor as a GGUF file stores it (`type` "Q8_0", "Q4_0" or "F32") and as the reference
// gives it: the F32 values the file stands for.
struct Stored {
  StTensor gguf, reference;
};
Stored stored_as(const StTensor& t, const std::string& type) {
  if (type == "F32") {
    StTensor f = f32_tensor(t, values_of(t));
    return {f, f};
  }
  StTensor q = quantized(t, type);
  StTensor ref = decoded(q);
  return {std::move(q), std::move(ref)};
}

TEST_F(BflLayout, GgufQuantizedBlocksConvertToTheirDecodedWeights) {
  // The 2-D tensors whose rows are whole blocks are stored as Q8_0, Q4_0 and F32 in turn, the
  // token embedding as Q8_0; 1-D tensors as F32.
  static const char* const kTurns[] = {"Q8_0", "Q4_0", "F32"};
  std::set<std::string> q8_0;  // canonical names of the tensors stored as Q8_0
  size_t q4_0 = 0;
  auto count = [&](const std::string& canonical, const std::string& type) {
    if (type == "Q8_0") q8_0.insert(canonical);
    if (type == "Q4_0") ++q4_0;
  };

  std::vector<StTensor> transformer, transformer_ref;
  std::map<std::string, size_t> turn;  // q, k and v of one attention share a turn: BFL fuses them
  for (const StTensor& t : tiny_transformer()) {
    std::string type = "F32";
    if (t.shape.size() == 2 && t.shape[1] % kBlock == 0) {
      static const std::regex qkv(R"(to_[qkv]\.|add_[qkv]_proj)");
      const std::string key = std::regex_replace(t.name, qkv, "qkv");
      type = kTurns[turn.emplace(key, turn.size()).first->second % 3];
      // A q8 container keeps the shared tensors at bf16 (the default policy), where repacked
      // blocks would not show: Q8_0 only inside the blocks.
      const bool in_block = t.name.starts_with("transformer_blocks.") ||
                            t.name.starts_with("single_transformer_blocks.");
      if (type == "Q8_0" && !in_block) type = "Q4_0";
    }
    count("transformer." + t.name, type);
    Stored s = stored_as(t, type);
    transformer.push_back(std::move(s.gguf));
    transformer_ref.push_back(std::move(s.reference));
  }
  testing::write_gguf(dir_ / "transformer.gguf", {{"general.architecture", std::string("flux")}},
                      bfl_transformer({}, transformer));
  testing::write_safetensors(dir_ / "transformer-ref.safetensors",
                             bfl_transformer({}, transformer_ref));

  std::vector<StTensor> text_encoder_ref;  // under the transformers names
  size_t matrices = 0;
  write_llama_cpp_text_encoder(dir_ / "text_encoder.gguf", [&](StTensor& t) {
    std::string type = "F32";
    if (t.name == "model.embed_tokens.weight")
      type = "Q8_0";
    else if (t.shape.size() == 2 && t.shape[1] % kBlock == 0)
      type = kTurns[matrices++ % 3];
    // The pipeline reads Qwen3's stream after layer 27 (1-based): the tiny model's last layer
    // (index 27) is in the files but no container holds it.
    if (!t.name.starts_with("model.layers.27.")) count("text_encoder." + t.name, type);
    Stored s = stored_as(t, type);
    text_encoder_ref.push_back(std::move(s.reference));
    t = std::move(s.gguf);
  });
  testing::write_safetensors(dir_ / "text_encoder-ref.safetensors", text_encoder_ref);
  ASSERT_GE(q8_0.size(), 20u);
  ASSERT_GE(q4_0, 20u);
  ASSERT_TRUE(q8_0.count("text_encoder.model.embed_tokens.weight"));

  auto arg = [](const fs::path& p) { return " '" + p.string() + "'"; };
  const fs::path m = testing::tiny_model();
  const std::string vae = " --vae" + arg(m / "vae/diffusion_pytorch_model.safetensors");
  const std::string gguf = " --diffusion-model" + arg(dir_ / "transformer.gguf") +
                           " --text-encoder" + arg(dir_ / "text_encoder.gguf") + vae +
                           " --variant 4b";
  const std::string reference = " --diffusion-model" + arg(dir_ / "transformer-ref.safetensors") +
                                " --text-encoder" + arg(dir_ / "text_encoder-ref.safetensors") +
                                vae + " --tokenizer" + arg(m / "tokenizer") + " --variant 4b";
  const std::string run = " -p \"a red cube\" -s 2 -W 64 -H 64 --seed 3 --no-cache --threads 2 -q";
  std::string log;

  // Blocks are not run as they are: the file must be converted first, and nothing is written.
  EXPECT_NE(testing::run_klein("generate" + gguf + run + " -o" + arg(dir_ / "x.png"), &log), 0);
  EXPECT_NE(log.find("convert it first"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir_ / "x.png"));

  // Converted to f32 (no --tokenizer: it comes from the text encoder's metadata), the GGUF
  // files generate exactly what their decoded values do.
  ASSERT_EQ(testing::run_klein("convert" + gguf + " -t f32 -o" + arg(dir_ / "f32.klein"), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein("generate -m" + arg(dir_ / "f32.klein") + run + " --dump" +
                                   arg(dir_ / "f32") + " -o" + arg(dir_ / "f32.png"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate" + reference + run + " --dump" + arg(dir_ / "ref") +
                                   " -o" + arg(dir_ / "ref.png"),
                               &log),
            0)
      << log;
  for (const char* f : {"prompt_embeds.npy", "final_latents.npy"})
    EXPECT_TRUE(read_text_file(dir_ / "f32" / f) == read_text_file(dir_ / "ref" / f))
        << f << " differs from the reference's";
  // The decoded image from the same latents: the VAE is f32 in the container and bf16 in the
  // tiny model's file, and on AMX CPUs BF16 weights are multiplied on tiles as three exact
  // bf16 parts, whose float32 sums round in another order than float32 weights' do: equal up
  // to that rounding (bit for bit elsewhere).
  {
    const std::vector<float> a = read_npy(dir_ / "f32" / "image.npy").to_f32();
    const std::vector<float> b = read_npy(dir_ / "ref" / "image.npy").to_f32();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_LE(testing::scaled_diff(a.data(), b.data(), int64_t(a.size())), 1e-5)
        << "image.npy differs from the reference's";
  }

  // Converted to q8, the Q8_0 tensors are their own blocks repacked: measured against the
  // GGUF files they have no error at all, while the requantized ones have some.
  ASSERT_EQ(testing::run_klein("convert" + gguf + " -t q8 -o" + arg(dir_ / "q8.klein"), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein("report" + gguf + " --candidate" + arg(dir_ / "q8.klein") +
                                   " --no-e2e --threads 2 -q -o" + arg(dir_ / "report"),
                               &log),
            0)
      << log;
  const auto report = nlohmann::json::parse(read_text_file(dir_ / "report" / "report.json"));
  std::set<std::string> reported, requantized_with_error;
  for (const auto& t : report["tensors"]) {
    const std::string name = t["name"];
    if (!q8_0.count(name)) {
      if (t["type"] == "q8" && t["rmse"].get<double>() > 0) requantized_with_error.insert(name);
      continue;
    }
    EXPECT_EQ(t["type"].get<std::string>(), "q8") << name;
    EXPECT_EQ(t["rmse"].get<double>(), 0.0) << name;
    reported.insert(name);
  }
  for (const std::string& name : q8_0)
    EXPECT_TRUE(reported.count(name)) << name << " is not in the report";
  EXPECT_GE(requantized_with_error.size(), 20u);
}

// --- Z-Image: the original names of Tongyi-MAI's checkpoints, as ComfyUI ships them -------

using testing::zimage_model;

// zimage-tiny's transformer under the original names: the inverse of diffusers' single-file
// conversion (convert_z_image_transformer_checkpoint_to_diffusers), written here from its
// rename table: q, k, v fused into attention.qkv, attention.out / q_norm / k_norm, x_embedder
// and final_layer without their "all_" and patch suffix, plus the final norm the original
// model has and never uses. That diffusers' conversion reads exactly these tensors back as the
// diffusers transformer is checked by ZImageOriginalNamesAreWhatDiffusersConvertsBack.
std::vector<StTensor> original_zimage_transformer(const std::string& prefix) {
  TensorMap d = by_name(
      testing::read_all(zimage_model() / "transformer/diffusion_pytorch_model.safetensors"));
  std::vector<StTensor> out;
  auto put = [&](StTensor t) {
    t.name = prefix + t.name;
    out.push_back(std::move(t));
  };
  for (const std::string group : {"noise_refiner.", "context_refiner.", "layers."}) {
    for (int i = 0; i < 2; ++i) {
      const std::string a = group + std::to_string(i) + ".attention.";
      const StTensor q = take(d, a + "to_q.weight"), k = take(d, a + "to_k.weight"),
                     v = take(d, a + "to_v.weight");
      put(fused(a + "qkv.weight", q, k, v));
      put(renamed(take(d, a + "to_out.0.weight"), a + "out.weight"));
      put(renamed(take(d, a + "norm_q.weight"), a + "q_norm.weight"));
      put(renamed(take(d, a + "norm_k.weight"), a + "k_norm.weight"));
    }
  }
  for (const std::string end : {"weight", "bias"}) {
    put(renamed(take(d, "all_x_embedder.2-1." + end), "x_embedder." + end));
    put(renamed(take(d, "all_final_layer.2-1.linear." + end), "final_layer.linear." + end));
    put(renamed(take(d, "all_final_layer.2-1.adaLN_modulation.1." + end),
                "final_layer.adaLN_modulation.1." + end));
  }
  StTensor norm = d.at("layers.0.attention_norm1.weight");  // [dim], any values
  put(renamed(norm, "norm_final.weight"));
  for (auto& [name, t] : d) put(std::move(t));  // the rest: the same names in both
  return out;
}

// The FLUX.1 VAE of zimage-tiny under BFL names, as ComfyUI's ae.safetensors holds it.
std::vector<StTensor> bfl_zimage_vae() {
  std::vector<StTensor> out;
  for (StTensor t : testing::read_all(zimage_model() / "vae/diffusion_pytorch_model.safetensors")) {
    const bool attention_linear =
        t.name.find(".attentions.0.to_") != std::string::npos && t.name.ends_with(".weight");
    t.name = bfl_vae_name(t.name, 4);
    if (attention_linear) t.shape = {t.shape[0], t.shape[1], 1, 1};
    out.push_back(std::move(t));
  }
  return out;
}

TEST_F(BflLayout, ZImageOriginalNamesLoadBitIdentical) {
  for (const std::string prefix : {"", "model.diffusion_model."}) {
    SCOPED_TRACE("prefix '" + prefix + "'");
    testing::write_safetensors(dir_ / "z_image_turbo_bf16.safetensors",
                               original_zimage_transformer(prefix));
    ModelPaths paths;
    paths.model = zimage_model();
    paths.diffusion_model = dir_ / "z_image_turbo_bf16.safetensors";
    const std::unique_ptr<WeightStore> single = open_model(paths),
                                       diffusers = open_model(zimage_model());
    expect_same_weights(*diffusers, *single, 409);
    EXPECT_EQ(single->config().family, "z-image");
    // No config.json came with the file: the shapes must give the same configuration.
    EXPECT_EQ(single->config().family_transformer, diffusers->config().family_transformer);
    const ModelSummary s = describe_model(paths);
    EXPECT_EQ(s.components[0].layout, Layout::Original);
  }
}

// The file above is what diffusers' single-file conversion reads back as the diffusers
// transformer: tools/zimage/original_names.py ran convert_z_image_transformer_checkpoint_to_diffusers
// (diffusers 58eb52c0) on these names and recorded each tensor (dtype, shape, FNV-1a 64 of its
// bytes) in tests/data/zimage-single-file/manifest.json; the one tensor the conversion drops has
// no hash.
TEST_F(BflLayout, ZImageOriginalNamesAreWhatDiffusersConvertsBack) {
  const auto manifest = nlohmann::json::parse(read_text_file(
      fs::path(KLEIN_SOURCE_DIR) / "tests/data/zimage-single-file/manifest.json"));
  ASSERT_TRUE(manifest["converts_back_exactly"].get<bool>());
  const auto& want = manifest["tensors"];
  const std::vector<StTensor> ours = original_zimage_transformer("");
  EXPECT_EQ(ours.size(), want.size());
  for (const StTensor& t : ours) {
    SCOPED_TRACE(t.name);
    ASSERT_TRUE(want.contains(t.name)) << "not a name diffusers' conversion reads back";
    const auto& w = want[t.name];
    EXPECT_EQ(t.dtype, w["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, w["shape"].get<Shape>());
    if (!w.contains("fnv1a64")) continue;
    EXPECT_EQ(testing::fnv1a64(t.bytes.data(), t.bytes.size()),
              w["fnv1a64"].get<std::string>());
  }
}

TEST_F(BflLayout, ZImageGgufWithTheOriginalNamesLoadsBitIdentical) {
  // ComfyUI-GGUF keeps the state dict's names; float tensors run without converting.
  testing::write_gguf(dir_ / "z_image_turbo.gguf", {{"general.architecture", std::string("lumina2")}},
                      original_zimage_transformer(""));
  ModelPaths paths;
  paths.model = zimage_model();
  paths.diffusion_model = dir_ / "z_image_turbo.gguf";
  expect_same_weights(*open_model(zimage_model()), *open_model(paths), 409);
}

TEST_F(BflLayout, ZImageFromSingleFilesGetsTheFamilysVaeScaleAndScheduler) {
  testing::write_safetensors(dir_ / "z_image_turbo_bf16.safetensors",
                             original_zimage_transformer("model.diffusion_model."));
  testing::write_safetensors(dir_ / "ae.safetensors", bfl_zimage_vae());
  ModelPaths paths;
  paths.diffusion_model = dir_ / "z_image_turbo_bf16.safetensors";
  paths.text_encoder = zimage_model() / "text_encoder/model.safetensors.index.json";
  paths.vae = dir_ / "ae.safetensors";
  const std::unique_ptr<WeightStore> single = open_model(paths),
                                     diffusers = open_model(zimage_model());
  expect_same_weights(*diffusers, *single, 409);
  // Without config.json files, the FLUX.1 VAE's factors and Z-Image-Turbo's scheduler are the
  // family's; the diffusers directory's files say the same.
  const ModelConfig& a = diffusers->config();
  const ModelConfig& b = single->config();
  EXPECT_FALSE(b.vae.latent_batch_norm);
  EXPECT_EQ(b.vae.scaling_factor, a.vae.scaling_factor);
  EXPECT_EQ(b.vae.shift_factor, a.vae.shift_factor);
  EXPECT_EQ(b.vae.latent_channels, 16);
  EXPECT_FALSE(b.vae.use_quant_conv);
  EXPECT_EQ(b.scheduler.use_dynamic_shifting, a.scheduler.use_dynamic_shifting);
  EXPECT_EQ(b.scheduler.shift, a.scheduler.shift);
  EXPECT_EQ(b.scheduler.num_train_timesteps, a.scheduler.num_train_timesteps);
}

// Turbo and the base model have the same tensors: a single file is what its name says, and a
// name that does not say leaves it to --variant.
TEST_F(BflLayout, ZImageVariantOfASingleFileFromItsNameOrVariant) {
  ModelPaths paths;
  paths.text_encoder = zimage_model() / "text_encoder/model.safetensors.index.json";
  paths.vae = zimage_model() / "vae/diffusion_pytorch_model.safetensors";
  for (const char* name : {"z_image_turbo_bf16.safetensors", "z_image_bf16.safetensors"}) {
    testing::write_safetensors(dir_ / name, original_zimage_transformer(""));
    paths.diffusion_model = dir_ / name;
    paths.variant = "";
    const ModelConfig c = open_model(paths)->config();
    if (std::string(name).find("turbo") != std::string::npos) {
      EXPECT_TRUE(c.undecided_variant.empty()) << c.undecided_variant;
      EXPECT_TRUE(c.is_distilled);
    } else {
      EXPECT_THAT(c.undecided_variant, ::testing::HasSubstr("give --variant zimage-turbo or "
                                                            "--variant zimage"));
    }
    paths.variant = "zimage";
    const ModelConfig base = open_model(paths)->config();
    EXPECT_TRUE(base.undecided_variant.empty());
    EXPECT_FALSE(base.is_distilled);
    EXPECT_EQ(variant_name(base), "zimage");
  }
}

TEST_F(BflLayout, ZImageFusedQkvOfTheWrongShapeIsNamed) {
  std::vector<StTensor> tensors = original_zimage_transformer("");
  for (StTensor& t : tensors)
    if (t.name == "layers.1.attention.qkv.weight") {
      t.shape[0] -= 1;
      t.bytes.resize(t.bytes.size() - size_t(t.shape[1]) * 2);
    }
  testing::write_safetensors(dir_ / "z.safetensors", tensors);
  ModelPaths paths;
  paths.model = zimage_model();
  paths.diffusion_model = dir_ / "z.safetensors";
  EXPECT_THAT(testing::error_of([&] { open_model(paths); }),
              ::testing::AllOf(::testing::HasSubstr("layers.1.attention.qkv.weight"),
                               ::testing::HasSubstr("3 x dim rows")));
}

// A ComfyUI-GGUF Z-Image transformer of GGML blocks (Q8_0 and Q4_0 in turn, fused
// attention.qkv among them) converts to what its blocks stand for: the container generates
// exactly what the decoded values, given as safetensors under the same names, do.
TEST_F(BflLayout, ZImageGgufOfQuantizedBlocksConvertsToItsDecodedWeights) {
  std::vector<StTensor> gguf, reference;
  size_t quantized_tensors = 0;
  for (const StTensor& t : original_zimage_transformer("")) {
    std::string type = "F32";
    if (t.shape.size() == 2 && t.shape[1] % kBlock == 0)
      type = quantized_tensors++ % 2 ? "Q4_0" : "Q8_0";
    Stored stored = stored_as(t, type);
    gguf.push_back(std::move(stored.gguf));
    reference.push_back(std::move(stored.reference));
  }
  ASSERT_GE(quantized_tensors, 30u);
  testing::write_gguf(dir_ / "z_image_turbo-Q4_0.gguf",
                      {{"general.architecture", std::string("lumina2")}}, gguf);
  testing::write_safetensors(dir_ / "z_image_turbo-ref.safetensors", reference);

  auto arg = [](const fs::path& p) { return " '" + p.string() + "'"; };
  const std::string run = " -p \"a red cube\" -s 2 -W 32 -H 48 --seed 3 --no-cache --threads 2 -q";
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m" + arg(zimage_model()) + " --diffusion-model" +
                                   arg(dir_ / "z_image_turbo-Q4_0.gguf") + " -t f32 -q -o" +
                                   arg(dir_ / "z.klein"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate -m" + arg(dir_ / "z.klein") + run + " --dump" +
                                   arg(dir_ / "from-gguf") + " -o" + arg(dir_ / "a.png"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate -m" + arg(zimage_model()) + " --diffusion-model" +
                                   arg(dir_ / "z_image_turbo-ref.safetensors") + run +
                                   " --dump" + arg(dir_ / "ref") + " -o" + arg(dir_ / "b.png"),
                               &log),
            0)
      << log;
  for (const char* f : {"final_latents.npy", "image.npy"})
    EXPECT_TRUE(read_text_file(dir_ / "from-gguf" / f) == read_text_file(dir_ / "ref" / f))
        << f << " differs from the reference's";
}

}  // namespace
}  // namespace klein
