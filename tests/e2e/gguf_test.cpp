// GGUF files as a model: tools/gguf/make_fixtures.py had gguf-py write the tiny transformer
// under BFL names (as ComfyUI-GGUF names FLUX.2) and the tiny Qwen3 under llama.cpp's names
// with its tokenizer in the metadata, in a mix of GGML types (tests/data/gguf-model), and
// recorded what gguf-py decodes every tensor to (decoded.json: shape and XXH3-64 of the
// float32 values, per container tensor name). Converting the GGUF files to float32 must give
// exactly those bytes; a model written from them is then gguf-py's decoded model, and
// converting the GGUF files (no --tokenizer: it comes from the text encoder's metadata) must
// give its generation, step by step; and the quantized GGUF cannot be run without converting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/files.h"
#include "e2e/golden_dump.h"
#include "formats/container/reader.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

const fs::path kFixtures = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "gguf-model";

using testing::shell_arg;

using testing::kRun;

std::string vae() {
  return shell_arg(testing::tiny_model() / "vae" / "diffusion_pytorch_model.safetensors");
}

std::string gguf_model() {
  return " --diffusion-model " + shell_arg(kFixtures / "transformer.gguf") + " --text-encoder " +
         shell_arg(kFixtures / "text_encoder.gguf") + " --vae " + vae() + " --variant 4b";
}

void convert(const std::string& model, const std::string& type, const fs::path& container) {
  std::string log;
  ASSERT_EQ(
      testing::run_klein("convert" + model + " -t " + type + " -o " + shell_arg(container), &log),
      0)
      << log;
}

// Every transformer and text-encoder tensor of a float32 container converted from the GGUF
// files holds the bytes gguf-py decodes it to (row-major float32), and every tensor gguf-py
// decoded is there.
void expect_gguf_py_values(const fs::path& f32_container) {
  const auto decoded =
      nlohmann::json::parse(read_text_file(kFixtures / "decoded.json"))["tensors"];
  const container::ContainerFile file(f32_container);
  std::set<std::string> seen;
  for (const container::TensorEntry& t : file.index().tensors) {
    if (t.name.rfind("transformer.", 0) != 0 && t.name.rfind("text_encoder.", 0) != 0) continue;
    ASSERT_TRUE(decoded.contains(t.name)) << t.name << " is not one of gguf-py's tensors";
    const auto& want = decoded[t.name];
    EXPECT_EQ(t.type, DType::F32) << t.name;
    EXPECT_EQ(t.layout, 0) << t.name;
    EXPECT_EQ(std::vector<int64_t>(t.shape.begin(), t.shape.end()),
              want["shape"].get<std::vector<int64_t>>())
        << t.name;
    EXPECT_EQ(container::hex64(container::xxh3(file.at(t.offset), size_t(t.size))),
              want["xxh3"].get<std::string>())
        << t.name << ": not the values gguf-py decodes";
    seen.insert(t.name);
  }
  // Every tensor gguf-py decoded is there, but for what klein never runs: the text encoder's
  // last layer and final norm (its context is taken from earlier layers).
  int last_layer = -1;
  for (const auto& [name, _] : decoded.items())
    if (name.rfind("text_encoder.model.layers.", 0) == 0)
      last_layer = std::max(last_layer, std::stoi(name.substr(26)));
  const std::string unused_layer = "text_encoder.model.layers." + std::to_string(last_layer) + ".";
  for (const auto& [name, _] : decoded.items()) {
    if (!seen.count(name)) {
      EXPECT_TRUE(name == "text_encoder.model.norm.weight" || name.rfind(unused_layer, 0) == 0)
          << name << ": decoded by gguf-py, missing from the container";
    }
  }
  EXPECT_GT(seen.size(), decoded.size() - 20);
}

// The float32 tensors of `prefix` in a container as a safetensors file, under their names
// without the prefix.
void write_safetensors(const container::ContainerFile& file, const std::string& prefix,
                       const fs::path& out) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t at = 0;
  std::vector<const container::TensorEntry*> kept;
  for (const container::TensorEntry& t : file.index().tensors) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    ASSERT_EQ(t.type, DType::F32) << t.name;
    header[t.name.substr(prefix.size())] = {
        {"dtype", "F32"},
        {"shape", std::vector<int64_t>(t.shape.begin(), t.shape.end())},
        {"data_offsets", {at, at + t.size}}};
    at += t.size;
    kept.push_back(&t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::ofstream f(out, std::ios::binary);
  const uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), std::streamsize(text.size()));
  for (const auto* t : kept)
    f.write(reinterpret_cast<const char*>(file.at(t->offset)), std::streamsize(t->size));
  ASSERT_TRUE(f.good()) << out;
}

// gguf-py's decoded model as single files, with the tiny model's own tokenizer directory and
// VAE: written from DIR/f32.klein, the GGUF files converted to float32, once its values are
// checked to be gguf-py's.
std::string reference_model(const fs::path& dir) {
  const fs::path f32 = dir / "f32.klein";
  convert(gguf_model(), "f32", f32);
  expect_gguf_py_values(f32);
  const container::ContainerFile file(f32);
  write_safetensors(file, "transformer.", dir / "transformer-ref.safetensors");
  write_safetensors(file, "text_encoder.", dir / "text_encoder-ref.safetensors");
  return " --diffusion-model " + shell_arg(dir / "transformer-ref.safetensors") +
         " --text-encoder " + shell_arg(dir / "text_encoder-ref.safetensors") + " --vae " + vae() +
         " --tokenizer " + shell_arg(testing::tiny_model() / "tokenizer") + " --variant 4b";
}

TEST(GgufModel, ConvertedHoldsTheValuesGgufPyDecodes) {
  const fs::path dir = testing::temp_dir("gguf-values");
  convert(gguf_model(), "f32", dir / "f32.klein");
  expect_gguf_py_values(dir / "f32.klein");
}

TEST(GgufModel, ConvertedGivesTheGenerationOfItsDecodedWeights) {
  const fs::path dir = testing::temp_dir("gguf-e2e");
  const std::string reference = reference_model(dir);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(testing::generate_compared_run(reference, dir, "reference"));
  // F32 (converted by reference_model): every tensor as gguf-py decodes it; the generation
  // is the reference's exactly (prompt embedding included, so the tokenizer from the
  // metadata gave the same ids as the tokenizer directory).
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(dir / "f32.klein"), dir, "f32"));
  testing::expect_dump_matches(dir / "f32", dir / "reference",
                               {"prompt_embeds", "final_latents", "image"}, 4);
  testing::expect_png_matches(dir / "f32.png", dir / "reference.png", 64, 64);
  // Q8: the Q8_0 tensors are repacked, the rest quantized from the decoded values; the
  // reference quantized by the same converter gives the same image.
  convert(gguf_model(), "q8", dir / "q8.klein");
  convert(reference, "q8", dir / "ref-q8.klein");
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(dir / "q8.klein"), dir, "q8"));
  ASSERT_TRUE(
      testing::generate_compared_run(" -m " + shell_arg(dir / "ref-q8.klein"), dir, "ref-q8"));
  testing::expect_png_matches(dir / "q8.png", dir / "ref-q8.png", 64, 64);
  // klein report measures the Q8 container against the GGUF itself (its blocks decoded): the
  // Q8_0 tensors were repacked, not requantized, so they have no error at all.
  std::string log;
  ASSERT_EQ(
      testing::run_klein("report" + gguf_model() + " --candidate " + shell_arg(dir / "q8.klein") +
                             " -q -o " + shell_arg(dir / "report"),
                         &log),
      0)
      << log;
  const auto report = nlohmann::json::parse(read_text_file(dir / "report" / "report.json"));
  std::set<std::string> exact;
  for (const auto& t : report["tensors"])
    if (t["type"] == "q8" && t["rmse"].get<double>() == 0.0)
      exact.insert(t["name"].get<std::string>());
  // The fixture stores every 7th matrix as Q8_0 (the embedding is Q4_0).
  EXPECT_GE(exact.size(), 20u);
  EXPECT_TRUE(exact.count("text_encoder.model.layers.0.mlp.down_proj.weight"));
  EXPECT_TRUE(std::any_of(exact.begin(), exact.end(), [](const std::string& n) {
    return n.rfind("transformer.", 0) == 0;
  })) << "no transformer tensor repacked";
}

TEST(GgufModel, QuantizedGgufAsksToBeConverted) {
  const fs::path dir = testing::temp_dir("gguf-run");
  std::string log;
  EXPECT_NE(testing::run_klein("generate" + gguf_model() + kRun + " -o " + shell_arg(dir / "x.png"),
                               &log),
            0);
  EXPECT_NE(log.find("convert it first: klein convert"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  // inspect describes it, GGML types by name.
  ASSERT_EQ(testing::run_klein("inspect" + gguf_model(), &log), 0) << log;
  EXPECT_NE(log.find("Q5_1"), std::string::npos) << log;
}

}  // namespace
}  // namespace klein
