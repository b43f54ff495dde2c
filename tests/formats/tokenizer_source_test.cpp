// Where the tokenizer comes from, for each combination of -m, single files and --tokenizer:
// one rule (tokenizer_source, weights/model_source.h), which read_tokenizer_files, inspect and
// every command follow: --tokenizer DIR, else the container of -m, else a GGUF text encoder
// that carries a tokenizer, else the tokenizer/ of -m DIR. The candidates hold different
// vocabularies, so each test sees which tokenizer was read, not only which one was named.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "formats/gguf_files.h"
#include "formats/st_files.h"
#include "support/testing.h"
#include "weights/container_store.h"
#include "weights/model_source.h"
#include "weights/summary.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Kind = TokenizerSource::Kind;
using ::testing::HasSubstr;
using testing::shell_arg;

using testing::test_name;

// The vocabularies of the candidates, told apart by `which_read`.
const json kDirectoryVocab = {{"x", 0}, {"y", 1}, {"xy", 2}};
const json kGgufVocab = {{"g", 0}, {"h", 1}, {"gh", 2}};

const json& tiny_vocab() {
  static const json v =
      json::parse(read_text_file(testing::tiny_model() / "tokenizer" / "vocab.json"));
  return v;
}

class TokenizerSources : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::temp_dir("tokenizer-source-" + test_name()); }
  void TearDown() override { fs::remove_all(dir_); }

  // A tokenizer directory whose vocabulary is none of the tiny model's.
  fs::path other_directory() {
    const fs::path d = dir_ / "other-tokenizer";
    fs::create_directories(d);
    testing::write_text(d / "vocab.json", kDirectoryVocab.dump());
    testing::write_text(d / "merges.txt", "#version: 0.2\nx y\n");
    return d;
  }
  // GGUF text encoders with and without a tokenizer in their metadata. No tensors: choosing
  // the tokenizer reads only the metadata.
  fs::path gguf_with_tokenizer() {
    const fs::path f = dir_ / "te-with-tokenizer.gguf";
    testing::write_gguf(f,
                        {{"general.architecture", std::string("qwen3")},
                         {"tokenizer.ggml.model", std::string("gpt2")},
                         {"tokenizer.ggml.tokens", std::vector<std::string>{"g", "h", "gh"}},
                         {"tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1}},
                         {"tokenizer.ggml.merges", std::vector<std::string>{"g h"}}},
                        {});
    return f;
  }
  fs::path gguf_without_tokenizer() {
    const fs::path f = dir_ / "te-without-tokenizer.gguf";
    testing::write_gguf(f, {{"general.architecture", std::string("qwen3")}}, {});
    return f;
  }

  // Which candidate `paths` reads, told by the vocabulary read: "tiny" (the tiny model's
  // tokenizer/ or a container converted from it), "directory" (other_directory) or "gguf".
  static std::string which_read(const ModelPaths& paths) {
    const TokenizerBytes b = read_tokenizer_files(paths);
    if (!b.vocab_json) return "no vocab.json from " + b.origin;
    const json v = json::parse(*b.vocab_json);
    if (v == tiny_vocab()) return "tiny";
    if (v == kDirectoryVocab) return "directory";
    if (v == kGgufVocab) return "gguf";
    return "an unknown vocabulary from " + b.origin;
  }

  fs::path dir_;
};

// The tiny model's components as single files.
ModelPaths single_files(const fs::path& text_encoder) {
  const fs::path m = testing::tiny_model();
  ModelPaths p;
  p.diffusion_model = m / "transformer" / "diffusion_pytorch_model.safetensors";
  p.text_encoder = text_encoder;
  p.vae = m / "vae" / "diffusion_pytorch_model.safetensors";
  return p;
}

fs::path safetensors_text_encoder() {
  return testing::tiny_model() / "text_encoder" / "model.safetensors.index.json";
}

TEST_F(TokenizerSources, DirectoryOfM) {
  ModelPaths p;
  p.model = testing::tiny_model();
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Directory);
  EXPECT_EQ(tokenizer_source(p).path, p.model / "tokenizer");
  EXPECT_EQ(which_read(p), "tiny");
}

TEST_F(TokenizerSources, ExplicitDirectoryOverridesTheDirectoryOfM) {
  ModelPaths p;
  p.model = testing::tiny_model();
  p.tokenizer = other_directory();
  EXPECT_EQ(tokenizer_source(p).path, p.tokenizer);
  EXPECT_EQ(which_read(p), "directory");
}

// The case of issue 33: a diffusers directory without tokenizer/ and a GGUF text encoder.
TEST_F(TokenizerSources, GgufTextEncoderStandsInForAMissingDirectoryOfM) {
  testing::TinyModelCopy m("tokenizer-source-no-tokenizer");
  fs::remove_all(m / "tokenizer");  // links only: the shared data is untouched
  ModelPaths p;
  p.model = m.dir();
  p.text_encoder = gguf_with_tokenizer();
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Gguf);
  EXPECT_EQ(tokenizer_source(p).path, p.text_encoder);
  EXPECT_EQ(which_read(p), "gguf");
}

TEST_F(TokenizerSources, GgufTextEncoderOverridesTheDirectoryOfM) {
  ModelPaths p;
  p.model = testing::tiny_model();
  p.text_encoder = gguf_with_tokenizer();
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Gguf);
  EXPECT_EQ(which_read(p), "gguf");
}

TEST_F(TokenizerSources, GgufTextEncoderAmongSingleFiles) {
  const ModelPaths p = single_files(gguf_with_tokenizer());
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Gguf);
  EXPECT_EQ(which_read(p), "gguf");
}

TEST_F(TokenizerSources, ExplicitDirectoryOverridesAGgufTextEncoder) {
  ModelPaths p = single_files(gguf_with_tokenizer());
  p.tokenizer = other_directory();
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Directory);
  EXPECT_EQ(which_read(p), "directory");
  // And with -m DIR as well: the explicit one is above both.
  p.model = testing::tiny_model();
  EXPECT_EQ(which_read(p), "directory");
}

TEST_F(TokenizerSources, SafetensorsSingleFilesWithExplicitDirectory) {
  ModelPaths p = single_files(safetensors_text_encoder());
  p.tokenizer = other_directory();
  EXPECT_EQ(which_read(p), "directory");
}

TEST_F(TokenizerSources, SafetensorsSingleFilesWithoutTokenizerSaySo) {
  const ModelPaths p = single_files(safetensors_text_encoder());
  const std::string message = testing::error_of([&] { (void)read_tokenizer_files(p); });
  EXPECT_THAT(message,
              HasSubstr("--text-encoder " + p.text_encoder.string() + " carries no tokenizer"));
  EXPECT_THAT(message, HasSubstr("give --tokenizer DIR"));
  EXPECT_THAT(testing::error_of([] { (void)tokenizer_source(ModelPaths{}); }),
              HasSubstr("no tokenizer given: use -m DIR or --tokenizer DIR"));
}

TEST_F(TokenizerSources, GgufWithoutTokenizerLeavesItToTheDirectoryOfM) {
  ModelPaths p;
  p.model = testing::tiny_model();
  p.text_encoder = gguf_without_tokenizer();
  EXPECT_EQ(tokenizer_source(p).path, p.model / "tokenizer");
  EXPECT_EQ(which_read(p), "tiny");
  // With no directory either, the message names both places that lack one.
  testing::TinyModelCopy m("tokenizer-source-bare-gguf");
  fs::remove_all(m / "tokenizer");
  p.model = m.dir();
  std::string message = testing::error_of([&] { (void)read_tokenizer_files(p); });
  EXPECT_THAT(message, HasSubstr(m.dir().string() + ": no tokenizer/ directory"));
  EXPECT_THAT(message, HasSubstr("--text-encoder " + p.text_encoder.string() +
                                 " carries no tokenizer (no tokenizer.ggml.model"));
  EXPECT_THAT(message, HasSubstr("give --tokenizer DIR"));
  // And as a single file.
  message = testing::error_of([&] { (void)read_tokenizer_files(single_files(p.text_encoder)); });
  EXPECT_THAT(message, HasSubstr("--text-encoder " + p.text_encoder.string() +
                                 " carries no tokenizer (no tokenizer.ggml.model"));
}

TEST_F(TokenizerSources, ContainerOfMCarriesItsOwn) {
  const fs::path container = dir_ / "tiny.klein";
  std::string log;
  ASSERT_TRUE(testing::convert_tiny(container, "-t keep -q"));
  ModelPaths p;
  p.model = container;
  EXPECT_EQ(tokenizer_source(p).kind, Kind::Container);
  EXPECT_THAT(read_tokenizer_files(p).origin, HasSubstr("tokenizer stored in the container"));
  EXPECT_EQ(which_read(p), "tiny");
  // --tokenizer is above every other source, a container's too.
  p.tokenizer = other_directory();
  EXPECT_EQ(which_read(p), "directory");
}

// From the command line, with the tiny Qwen3 as a llama.cpp GGUF (its tokenizer in the
// metadata) beside a diffusers directory that has no tokenizer/.
class TokenizerSourceCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::temp_dir("tokenizer-source-cli-" + test_name());
    model_.emplace("tokenizer-source-cli-model-" + test_name());
    fs::remove_all(*model_ / "tokenizer");
    testing::write_llama_cpp_text_encoder(gguf());
  }
  void TearDown() override {
    model_.reset();
    fs::remove_all(dir_);
  }
  fs::path gguf() const { return dir_ / "qwen3.gguf"; }
  // -m DIR --text-encoder X.gguf
  std::string model_options() const {
    return " -m " + shell_arg(model_->dir()) + " --text-encoder " + shell_arg(gguf());
  }

  fs::path dir_;
  std::optional<testing::TinyModelCopy> model_;
};

TEST_F(TokenizerSourceCli, ConvertTakesTheGgufTokenizerWhenMHasNone) {
  const fs::path out = dir_ / "out.klein";
  std::string log;
  ASSERT_EQ(
      testing::run_klein("convert" + model_options() + " -t keep -q -o " + shell_arg(out), &log), 0)
      << log;
  ModelPaths p;
  p.model = out;
  const TokenizerBytes b = read_tokenizer_files(p);
  ASSERT_TRUE(b.vocab_json);
  EXPECT_EQ(json::parse(*b.vocab_json), tiny_vocab());
}

TEST_F(TokenizerSourceCli, InspectAndTokenizeFindTheGgufTokenizer) {
  std::string out;
  ASSERT_EQ(testing::run_klein("inspect --json" + model_options(), &out), 0) << out;
  const json j = json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["tokenizer"]["source"], "gguf");
  EXPECT_EQ(j["tokenizer"]["dir"], gguf().string());
  // `klein tokenize` takes the GGUF as its model and reads the same ids as from the
  // tokenizer directory.
  std::string from_gguf, from_directory;
  const std::string text = " --template -p \"a red cube on a table\"";
  ASSERT_EQ(testing::run_klein("tokenize -m " + shell_arg(gguf()) + text, &from_gguf), 0)
      << from_gguf;
  ASSERT_EQ(
      testing::run_klein("tokenize -m " + shell_arg(testing::tiny_model()) + text, &from_directory),
      0)
      << from_directory;
  EXPECT_EQ(from_gguf, from_directory);
}

}  // namespace
}  // namespace klein
