// The klein binary: --version, --help and `klein inspect` on the tiny model. The expected
// counts were read off the tiny model's safetensors headers (49 transformer tensors, 310
// text-encoder tensors in two shards, 247 VAE tensors of which one is the int64 BatchNorm
// step counter; parameters count the elements of the float tensors).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/version.h"
#include "support/testing.h"

namespace klein {
namespace {

using json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string tiny() { return testing::tiny_model().string(); }

TEST(Cli, Version) {
  std::string out;
  EXPECT_EQ(testing::run_klein("--version", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(std::string("klein ") + KLEIN_VERSION));
}

TEST(Cli, HelpListsTheSubcommands) {
  std::string out;
  EXPECT_EQ(testing::run_klein("--help", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("inspect"));
}

TEST(Cli, NoSubcommandIsAnError) {
  std::string out;
  EXPECT_NE(testing::run_klein("", &out), 0) << out;
}

TEST(Cli, InspectHelpShowsTheModelOptions) {
  std::string out;
  EXPECT_EQ(testing::run_klein("inspect --help", &out), 0) << out;
  EXPECT_THAT(
      out, AllOf(HasSubstr("--model"), HasSubstr("--diffusion-model"), HasSubstr("--text-encoder"),
                 HasSubstr("--vae"), HasSubstr("--tokenizer"), HasSubstr("--json")));
}

TEST(Cli, InspectPrintsTheCounts) {
  std::string out;
  ASSERT_EQ(testing::run_klein("inspect -m " + tiny(), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("transformer: diffusers layout"));
  EXPECT_THAT(out, HasSubstr("49 tensors, 6,473,216 parameters, 12.9 MB"));
  EXPECT_THAT(out, HasSubstr("text encoder: diffusers layout"));
  EXPECT_THAT(out, HasSubstr("(2 shards)"));
  EXPECT_THAT(out, HasSubstr("310 tensors, 11,449,664 parameters, 22.9 MB"));
  EXPECT_THAT(out, HasSubstr("VAE: diffusers layout"));
  EXPECT_THAT(out, HasSubstr("247 tensors, 1,453,699 parameters, 2.9 MB"));
  EXPECT_THAT(out, HasSubstr("not read by inference: bn.num_batches_tracked"));
  EXPECT_THAT(out, HasSubstr("total: 606 tensors, 19,376,579 parameters, 38.8 MB"));
  EXPECT_THAT(out, HasSubstr("transformer.double.1"));
  EXPECT_THAT(out, ::testing::ContainsRegex("text_encoder.layer.27 .*\\(not read by inference\\)"));
  EXPECT_THAT(out, HasSubstr("num_layers=2"));
  EXPECT_THAT(out, HasSubstr((testing::tiny_model() / "transformer" / "config.json").string()));
}

TEST(Cli, InspectJsonParsesAndHasTheCounts) {
  std::string out;
  ASSERT_EQ(testing::run_klein("inspect --json -m " + tiny(), &out), 0) << out;
  json j = json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  ASSERT_EQ(j["components"].size(), 3u);
  const json& t = j["components"][0];
  const json& e = j["components"][1];
  const json& v = j["components"][2];
  EXPECT_EQ(t["component"], "transformer");
  EXPECT_EQ(t["layout"], "diffusers");
  EXPECT_EQ(t["tensors"], 49);
  EXPECT_EQ(t["parameters"], 6473216);
  EXPECT_EQ(t["bytes"], 12946432);
  EXPECT_EQ(t["dtypes"]["BF16"]["tensors"], 49);
  // shared, double.0, double.1, single.0, single.1
  EXPECT_EQ(t["units"].size(), 5u);
  EXPECT_EQ(e["component"], "text_encoder");
  EXPECT_EQ(e["tensors"], 310);
  EXPECT_EQ(e["files"].size(), 2u);
  // embed, 28 layers, final norm
  EXPECT_EQ(e["units"].size(), 30u);
  EXPECT_EQ(e["units"][1]["name"], "text_encoder.layer.0");
  EXPECT_EQ(e["units"][10]["name"], "text_encoder.layer.9");
  // The pipeline reads the output of layer 27 (1-based): layer index 27 and the norm are dead.
  EXPECT_EQ(e["units"][27]["name"], "text_encoder.layer.26");
  EXPECT_EQ(e["units"][27]["read_by_inference"], true);
  EXPECT_EQ(e["units"][28]["name"], "text_encoder.layer.27");
  EXPECT_EQ(e["units"][28]["read_by_inference"], false);
  EXPECT_EQ(e["units"][29]["read_by_inference"], false);
  EXPECT_EQ(v["component"], "vae");
  EXPECT_EQ(v["tensors"], 247);
  EXPECT_EQ(v["parameters"], 1453699);
  EXPECT_EQ(v["dtypes"]["I64"]["tensors"], 1);
  EXPECT_EQ(v["unused_tensors"], json::array({"bn.num_batches_tracked"}));
  EXPECT_EQ(j["total"]["tensors"], 606);
  EXPECT_EQ(j["total"]["parameters"], 19376579);
  EXPECT_EQ(j["total"]["bytes"], 38753166);
  EXPECT_EQ(j["config"]["transformer"]["joint_attention_dim"], 192);
  EXPECT_EQ(j["config"]["text_encoder"]["hidden_size"], 64);
  EXPECT_EQ(j["tokenizer"]["dir"], (testing::tiny_model() / "tokenizer").string());
}

TEST(Cli, InspectSingleFiles) {
  std::string out;
  const auto m = testing::tiny_model();
  ASSERT_EQ(
      testing::run_klein("inspect --json --diffusion-model " +
                             (m / "transformer/diffusion_pytorch_model.safetensors").string() +
                             " --text-encoder " +
                             (m / "text_encoder/model.safetensors.index.json").string() +
                             " --vae " + (m / "vae/diffusion_pytorch_model.safetensors").string(),
                         &out),
      0)
      << out;
  json j = json::parse(out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << out;
  EXPECT_EQ(j["components"][0]["config_file"], nullptr);
  EXPECT_EQ(j["components"][0]["config_source"], "tensor shapes");
  EXPECT_EQ(j["total"]["tensors"], 606);
  EXPECT_EQ(j["tokenizer"]["dir"], nullptr);
}

TEST(Cli, InspectOfAMissingPathNamesIt) {
  std::string out;
  EXPECT_NE(testing::run_klein("inspect -m /no/such/klein-model", &out), 0);
  EXPECT_THAT(out, AllOf(HasSubstr("error:"), HasSubstr("/no/such/klein-model"),
                         HasSubstr("does not exist")));
}

TEST(Cli, InspectWithoutAModelSaysWhatIsMissing) {
  std::string out;
  EXPECT_NE(testing::run_klein("inspect", &out), 0);
  EXPECT_THAT(out, HasSubstr("no model given for: --diffusion-model --text-encoder --vae"));
}

}  // namespace
}  // namespace klein
