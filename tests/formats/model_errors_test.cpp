// Whole-model checks on altered copies of the tiny model: each broken model is refused with
// a message naming the file(s) and what was expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "formats/st_files.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::AllOf;
using testing::error_of;
using ::testing::HasSubstr;
using testing::StTensor;
using testing::TinyModelCopy;

const char* kTransformerFile = "transformer/diffusion_pytorch_model.safetensors";
const char* kVae = "vae/diffusion_pytorch_model.safetensors";

using testing::test_name;

std::string open_error(const fs::path& model) {
  return error_of([&] { open_model(model); });
}

json read_config(const fs::path& path) { return json::parse(read_text_file(path)); }

// Rewrites one value of a copy's JSON configuration file.
void set_config_value(TinyModelCopy& copy, const std::string& file, const std::string& key,
                      const json& value) {
  json config = read_config(copy / file);
  config[key] = value;
  copy.write(file, config.dump(2));
}

// The tensors of one of the tiny model's files, to be altered and written back.
std::vector<StTensor> tiny_tensors(const char* relative) {
  return testing::read_all(testing::tiny_model() / relative);
}

StTensor& find(std::vector<StTensor>& tensors, const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return t;
  throw std::runtime_error("test data lacks " + name);
}

// Gives a BF16 tensor a new shape, with fresh bytes of the matching size.
void reshape(std::vector<StTensor>& tensors, const std::string& name, Shape shape) {
  StTensor& t = find(tensors, name);
  t.shape = std::move(shape);
  t.bytes = testing::pattern_bytes(size_t(numel(t.shape)) * 2, uint32_t(name.size()));
}

TEST(ModelErrors, TheUnalteredCopyLoads) {
  TinyModelCopy copy(test_name());
  EXPECT_NO_THROW(open_model(copy.dir()));
}

TEST(ModelErrors, MissingModelIndex) {
  TinyModelCopy copy(test_name());
  copy.remove("model_index.json");
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr(copy.dir().string()), HasSubstr("no model_index.json")));
}

TEST(ModelErrors, PathThatDoesNotExist) {
  EXPECT_THAT(open_error("/no/such/model"),
              AllOf(HasSubstr("/no/such/model"), HasSubstr("does not exist")));
}

TEST(ModelErrors, PathThatIsAFile) {
  const fs::path file = testing::tiny_model() / "model_index.json";
  EXPECT_THAT(open_error(file),
              AllOf(HasSubstr(file.string()), HasSubstr("is not a model directory")));
}

TEST(ModelErrors, MissingComponentDirectory) {
  TinyModelCopy copy(test_name());
  fs::remove_all(copy / "vae");
  EXPECT_THAT(open_error(copy.dir()), HasSubstr("missing vae/config.json"));
}

TEST(ModelErrors, MissingWeightsFile) {
  TinyModelCopy copy(test_name());
  copy.remove(kTransformerFile);
  EXPECT_THAT(open_error(copy.dir()), AllOf(HasSubstr((copy / "transformer").string()),
                                            HasSubstr("no diffusion_pytorch_model.safetensors")));
}

TEST(ModelErrors, ConfigThatDisagreesWithTheWeights) {
  TinyModelCopy copy(test_name());
  set_config_value(copy, "transformer/config.json", "num_layers", 3);
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / "transformer/config.json").string()),
                    HasSubstr("\"num_layers\" does not match the weights (config says 3, tensor "
                              "shapes say 2)")));
}

TEST(ModelErrors, ConfigValueOfTheWrongType) {
  TinyModelCopy copy(test_name());
  set_config_value(copy, "vae/config.json", "latent_channels", "thirty-two");
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / "vae/config.json").string()),
                    HasSubstr("key \"latent_channels\" has the wrong type (string)")));
}

TEST(ModelErrors, ConfigThatIsNotJson) {
  TinyModelCopy copy(test_name());
  copy.write("text_encoder/config.json", "{\"hidden_size\": ");
  EXPECT_THAT(open_error(copy.dir()), AllOf(HasSubstr((copy / "text_encoder/config.json").string()),
                                            HasSubstr("not valid JSON")));
}

TEST(ModelErrors, MissingTensor) {
  TinyModelCopy copy(test_name());
  auto tensors = tiny_tensors(kTransformerFile);
  std::erase_if(
      tensors, [](const StTensor& t) { return t.name == "transformer_blocks.1.attn.to_k.weight"; });
  copy.write_safetensors(kTransformerFile, tensors);
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / kTransformerFile).string()),
                    HasSubstr("the transformer lacks 1 tensor(s):\n  "
                              "transformer.transformer_blocks.1.attn.to_k.weight")));
}

TEST(ModelErrors, MissingTensorThatTheConfigIsReadFrom) {
  TinyModelCopy copy(test_name());
  auto tensors = tiny_tensors(kTransformerFile);
  std::erase_if(tensors, [](const StTensor& t) { return t.name == "x_embedder.weight"; });
  copy.write_safetensors(kTransformerFile, tensors);
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / kTransformerFile).string()),
                    HasSubstr("missing tensor transformer.x_embedder.weight")));
}

TEST(ModelErrors, TensorWithTheWrongShape) {
  TinyModelCopy copy(test_name());
  auto tensors = tiny_tensors(kTransformerFile);
  reshape(tensors, "transformer_blocks.1.attn.norm_added_k.weight", {64});
  copy.write_safetensors(kTransformerFile, tensors);
  EXPECT_THAT(
      open_error(copy.dir()),
      AllOf(
          HasSubstr((copy / kTransformerFile).string()),
          HasSubstr("transformer tensor transformer.transformer_blocks.1.attn.norm_added_k.weight "
                    "has shape [64] but the configuration implies [128]")));
}

TEST(ModelErrors, UnknownTensorInABflFile) {
  TinyModelCopy copy(test_name());
  testing::write_safetensors(
      copy / "bfl.safetensors",
      {{"img_in.weight", "BF16", {256, 128}, testing::pattern_bytes(256 * 128 * 2, 1)},
       {"double_blocks.0.img_attn.rotary.weight", "BF16", {4}, testing::pattern_bytes(8, 2)}});
  ModelPaths paths;
  paths.model = copy.dir();
  paths.diffusion_model = copy / "bfl.safetensors";
  EXPECT_THAT(
      error_of([&] { open_model(paths); }),
      AllOf(HasSubstr((copy / "bfl.safetensors").string()),
            HasSubstr("unknown transformer tensor double_blocks.0.img_attn.rotary.weight")));
}

TEST(ModelErrors, TransformerThatExpectsAnotherTextEncoder) {
  // A transformer built for a 256-wide text context, consistent with its own config, next to
  // the tiny text encoder whose three stacked hidden states give 3 x 64 = 192.
  TinyModelCopy copy(test_name());
  set_config_value(copy, "transformer/config.json", "joint_attention_dim", 256);
  auto tensors = tiny_tensors(kTransformerFile);
  reshape(tensors, "context_embedder.weight", {256, 256});
  copy.write_safetensors(kTransformerFile, tensors);
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr("the transformer (" + (copy / kTransformerFile).string() +
                              ") expects a text context 256 wide"),
                    HasSubstr("the text encoder (" +
                              (copy / "text_encoder/model.safetensors.index.json").string() +
                              ", hidden size 64) gives 3 x 64 = 192")));
}

TEST(ModelErrors, VaeWithAnotherLatentWidth) {
  // A self-consistent VAE with 16 latent channels (64 once patchified) where the transformer
  // works on 128.
  TinyModelCopy copy(test_name());
  set_config_value(copy, "vae/config.json", "latent_channels", 16);
  auto tensors = tiny_tensors(kVae);
  reshape(tensors, "encoder.conv_out.weight", {32, 64, 3, 3});
  reshape(tensors, "encoder.conv_out.bias", {32});
  reshape(tensors, "quant_conv.weight", {32, 32, 1, 1});
  reshape(tensors, "quant_conv.bias", {32});
  reshape(tensors, "post_quant_conv.weight", {16, 16, 1, 1});
  reshape(tensors, "post_quant_conv.bias", {16});
  reshape(tensors, "decoder.conv_in.weight", {64, 16, 3, 3});
  reshape(tensors, "bn.running_mean", {64});
  reshape(tensors, "bn.running_var", {64});
  copy.write_safetensors(kVae, tensors);
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr("the transformer (" + (copy / kTransformerFile).string() +
                              ") works on latents of 128 channels"),
                    HasSubstr("the VAE (" + (copy / kVae).string() + ") gives 16 x 2 x 2 = 64")));
}

TEST(ModelErrors, TextEncoderThatIsNotQwen3) {
  TinyModelCopy copy(test_name());
  json config = read_config(copy / "text_encoder/config.json");
  config["model_type"] = "mistral";
  config["architectures"] = {"MistralForCausalLM"};
  copy.write("text_encoder/config.json", config.dump(2));
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / "text_encoder/config.json").string()),
                    HasSubstr("model_type says mistral (no q/k norms), but the weights"),
                    HasSubstr("they are a Qwen3 model")));
}

TEST(ModelErrors, TextEncoderShardThatIsMissing) {
  TinyModelCopy copy(test_name());
  copy.remove("text_encoder/model-00002-of-00002.safetensors");
  EXPECT_THAT(open_error(copy.dir()),
              AllOf(HasSubstr((copy / "text_encoder/model.safetensors.index.json").string()),
                    HasSubstr("shard model-00002-of-00002.safetensors is missing")));
}

TEST(ModelErrors, SingleFilesWithoutTheRest) {
  ModelPaths paths;
  paths.diffusion_model = testing::tiny_model() / kTransformerFile;
  EXPECT_THAT(error_of([&] { open_model(paths); }),
              HasSubstr("no model given for: --text-encoder --vae"));
  paths.vae = "/no/such/vae.safetensors";
  EXPECT_THAT(error_of([&] { open_model(paths); }),
              AllOf(HasSubstr("--vae"), HasSubstr("/no/such/vae.safetensors does not exist")));
}

TEST(ModelErrors, SingleFilesAloneMakeAModel) {
  ModelPaths paths;
  paths.diffusion_model = testing::tiny_model() / kTransformerFile;
  paths.text_encoder = testing::tiny_model() / "text_encoder/model.safetensors.index.json";
  paths.vae = testing::tiny_model() / kVae;
  auto store = open_model(paths);
  EXPECT_EQ(store->config().transformer.num_double_blocks, 2);
  EXPECT_EQ(store->config().text_encoder.hidden, 64);
  EXPECT_EQ(store->config().vae.block_out_channels, (std::vector<int64_t>{32, 32, 64, 64}));
}

// A weight holding NaN or Inf is refused by convert, naming the tensor and the element, on
// the path that converts (q8) and on the one that copies bytes (bf16 from bf16); no output.
TEST(ModelErrors, ConvertRefusesNonFiniteWeights) {
  TinyModelCopy copy(test_name());
  auto tensors = tiny_tensors(kTransformerFile);
  for (auto& t : tensors)
    if (t.name == "transformer_blocks.1.attn.to_k.weight") {
      ASSERT_EQ(t.dtype, "BF16");
      const int64_t index = t.shape[1] + 5;  // row 1, column 5
      t.bytes[size_t(2 * index)] = std::byte{0xc0};
      t.bytes[size_t(2 * index + 1)] = std::byte{0x7f};  // 0x7fc0: a quiet NaN
    }
  copy.write_safetensors(kTransformerFile, tensors);
  for (const char* type : {"q8", "bf16"}) {
    const fs::path out = copy / (std::string("out-") + type + ".klein");
    std::string log;
    EXPECT_NE(testing::run_klein("convert -m " + copy.dir().string() + " -t " + type + " -q -o " +
                                     out.string(), &log), 0) << type;
    EXPECT_THAT(log, HasSubstr("tensor transformer.transformer_blocks.1.attn.to_k.weight holds "
                               "NaN or Inf (row 1, column 5)")) << type;
    EXPECT_FALSE(fs::exists(out)) << type;
  }
}

}  // namespace
}  // namespace klein
