// GGUF files as a model: tools/gguf/make_fixtures.py has gguf-py write the tiny transformer
// under BFL names (as ComfyUI-GGUF names FLUX.2) and the tiny Qwen3 under llama.cpp's names
// with its tokenizer in the metadata, in a mix of GGML types, together with the weights
// gguf-py decodes them to (safetensors, F32). Converting the GGUF files (no --tokenizer: it
// comes from the text encoder's metadata) must give the same generation as the decoded
// weights, step by step; and the quantized GGUF cannot be run without converting.
//
// The fixtures are tens of MB, so they are made here, which needs gguf-py (the gguf-py
// directory of a llama.cpp checkout in GGUF_PY) and numpy; without them the tests skip.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/files.h"
#include "e2e/golden_dump.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

const fs::path kSource = KLEIN_SOURCE_DIR;

using testing::shell_arg;

const std::string kRun = testing::kComparedRun;

// The fixture directory, made once per test program; empty when gguf-py is not available.
const fs::path& fixtures() {
  static const fs::path dir = []() -> fs::path {
    const char* gguf_py = std::getenv("GGUF_PY");
    if (gguf_py == nullptr || !fs::exists(fs::path(gguf_py) / "gguf")) return {};
    const fs::path out = testing::temp_dir("gguf-model");
    const std::string cmd = "python3 " +
                            shell_arg(kSource / "tools" / "gguf" / "make_fixtures.py") + " model " +
                            shell_arg(testing::tiny_model()) + " " + shell_arg(out) + " > " +
                            shell_arg(out / "log.txt") + " 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      ADD_FAILURE() << cmd << "\n" << read_text_file(out / "log.txt");
      return {};
    }
    return out;
  }();
  return dir;
}

#define NEED_FIXTURES()                                                                    \
  if (fixtures().empty())                                                                  \
  GTEST_SKIP()                                                                             \
      << "GGUF_PY does not name gguf-py (the gguf-py directory of a llama.cpp checkout); " \
         "python3-numpy is needed too"

std::string vae() {
  return shell_arg(testing::tiny_model() / "vae" / "diffusion_pytorch_model.safetensors");
}

std::string gguf_model() {
  return " --diffusion-model " + shell_arg(fixtures() / "transformer.gguf") + " --text-encoder " +
         shell_arg(fixtures() / "text_encoder.gguf") + " --vae " + vae() + " --variant 4b";
}

std::string reference_model() {
  return " --diffusion-model " + shell_arg(fixtures() / "transformer-ref.safetensors") +
         " --text-encoder " + shell_arg(fixtures() / "text_encoder-ref.safetensors") + " --vae " +
         vae() + " --tokenizer " + shell_arg(testing::tiny_model() / "tokenizer") + " --variant 4b";
}

void convert(const std::string& model, const std::string& type, const fs::path& container) {
  std::string log;
  ASSERT_EQ(
      testing::run_klein("convert" + model + " -t " + type + " -o " + shell_arg(container), &log),
      0)
      << log;
}

TEST(GgufModel, ConvertedGivesTheGenerationOfItsDecodedWeights) {
  NEED_FIXTURES();
  const fs::path dir = testing::temp_dir("gguf-e2e");
  ASSERT_TRUE(testing::generate_compared_run(reference_model(), dir, "reference"));
  // F32: every tensor kept as gguf-py decodes it; the generation is the reference's exactly
  // (prompt embedding included, so the tokenizer from the metadata gave the same ids).
  convert(gguf_model(), "f32", dir / "f32.klein");
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(dir / "f32.klein"), dir, "f32"));
  testing::expect_dump_matches(dir / "f32", dir / "reference",
                               {"prompt_embeds", "final_latents", "image"}, 4);
  testing::expect_png_matches(dir / "f32.png", dir / "reference.png", 64, 64);
  // Q8: the Q8_0 tensors are repacked, the rest quantized from the decoded values; the
  // reference quantized by the same converter gives the same image.
  convert(gguf_model(), "q8", dir / "q8.klein");
  convert(reference_model(), "q8", dir / "ref-q8.klein");
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
  // The fixture stores every 7th matrix as Q8_0, the embedding among them.
  EXPECT_GE(exact.size(), 20u);
  EXPECT_TRUE(exact.count("text_encoder.model.embed_tokens.weight"));
}

TEST(GgufModel, QuantizedGgufAsksToBeConverted) {
  NEED_FIXTURES();
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
