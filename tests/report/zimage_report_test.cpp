// klein report on Z-Image (../shared/testdata/zimage-tiny/model, the diffusers directory):
// the same comparison as for FLUX.2-klein through Z-Image's own stages: its default cases,
// every block of the noise refiner, the context refiner and the main layers probed, Q8 closer
// than Q4 end to end, the report's PSNR that of two plain generations, the CLI's report with a
// verified policy that `klein convert` accepts, and a candidate of another family refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "convert/convert.h"
#include "convert/policy.h"
#include "convert/report/e2e.h"
#include "convert/report/policy_search.h"
#include "convert/report/weights.h"
#include "core/error.h"
#include "core/files.h"
#include "formats/container/reader.h"
#include "pipeline/model_tokenizer.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using namespace report;

constexpr double kInfinite = std::numeric_limits<double>::infinity();

using testing::zimage_model;

std::unique_ptr<WeightStore> open_zimage() {
  ModelPaths paths;
  paths.model = zimage_model();
  return open_model(paths);
}

Tokenizer zimage_tokenizer() {
  ModelPaths paths;
  paths.model = zimage_model();
  return load_model_tokenizer(paths);
}

// The tiny model's blocks, in the order its forward runs them (2 + 2 refiner, 2 main layers).
const std::vector<std::string> kBlocks = {"noise_refiner.0",   "noise_refiner.1",
                                          "context_refiner.0", "context_refiner.1",
                                          "layers.0",          "layers.1"};
const std::vector<std::string> kUnits = {
    "transformer.noise_refiner.0",   "transformer.noise_refiner.1", "transformer.context_refiner.0",
    "transformer.context_refiner.1", "transformer.layer.0",         "transformer.layer.1"};

class ZImageReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fs::path(testing::temp_dir("zimage-report")); }
  // Converted on first use (ctest runs every test in a process of its own).
  static const fs::path& container(const std::string& type) {
    auto it = files_.find(type);
    if (it == files_.end()) {
      convert::ConvertOptions o;
      o.source.model = zimage_model();
      o.output = *dir_ / ("zimage-" + type + ".klein");
      o.target = convert::parse_storage_type(type, "test");
      convert::convert_model(o);
      it = files_.emplace(type, o.output).first;
    }
    return it->second;
  }
  static E2eOptions one_case(BlockProbes blocks = BlockProbes::Both) {
    auto store = open_zimage();
    E2eOptions o;
    o.cases = make_cases(store->config(), {"a red fox in fresh snow"}, {42}, 0, 0, 0);
    o.blocks = blocks;
    return o;
  }
  static fs::path* dir_;
  static std::map<std::string, fs::path> files_;
};
fs::path* ZImageReport::dir_ = nullptr;
std::map<std::string, fs::path> ZImageReport::files_;

// The transformer stream is 256 wide: a test-sized model, measured at 64x64.
TEST_F(ZImageReport, DefaultCasesAreSmallForTheTinyModel) {
  auto store = open_zimage();
  const auto cases = make_cases(store->config(), {}, {}, 0, 0, 0);
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0].width, 64);
  EXPECT_EQ(cases[0].height, 64);
  EXPECT_EQ(cases[0].steps, 0) << "the model's default";
}

// Every block of the three kinds is probed, and the model against itself has no error
// anywhere: the probe's forward is the generation's (same inputs, same arithmetic).
TEST_F(ZImageReport, AModelAgainstItselfHasNoError) {
  auto reference = open_zimage();
  const Tokenizer tokenizer = zimage_tokenizer();
  Compute cx(2);
  Progress quiet;
  const E2eResult e = run_e2e(*reference, *reference, tokenizer, cx, one_case(), quiet);
  ASSERT_EQ(e.cases.size(), 1u);
  const CaseResult& c = e.cases[0];
  EXPECT_EQ(c.spec.steps, 8) << "Z-Image-Turbo's default";
  EXPECT_EQ(c.step_latents.size(), 8u);
  EXPECT_EQ(c.context.nmse, 0.0);
  EXPECT_EQ(c.final_latents.nmse, 0.0);
  EXPECT_EQ(c.psnr_db, kInfinite);
  // Qwen3 to the last layer but one: 5 of the tiny encoder's 6 layers.
  EXPECT_EQ(c.text_layers.size(), 5u);
  ASSERT_TRUE(e.probe);
  std::vector<std::string> names, units;
  for (const auto& b : e.probe->blocks) {
    names.push_back(b.name);
    units.push_back(b.unit);
    ASSERT_TRUE(b.accumulated && b.isolated) << b.name;
    EXPECT_EQ(b.accumulated->nmse, 0.0) << b.name;
    EXPECT_EQ(b.isolated->nmse, 0.0) << b.name;
    EXPECT_GT(b.accumulated->count, 0) << b.name;
  }
  EXPECT_EQ(names, kBlocks);
  EXPECT_EQ(units, kUnits);
  // Each block is compared over its real tokens only (the 64x64 image has 16 of 2x2 latent
  // patches, padded to 32 rows; the caption's tokens are padded too): the image rows for the
  // noise refiner, the caption's for the context refiner, both for the main layers.
  const auto& b = e.probe->blocks;
  EXPECT_EQ(b[0].accumulated->count, 16 * 256);
  EXPECT_EQ(b[4].accumulated->count, b[0].accumulated->count + b[2].accumulated->count);
  EXPECT_EQ(b[2].accumulated->count % 256, 0);
  for (const auto& s : e.probe->sensitivities) EXPECT_EQ(s.velocity_nmse, 0.0) << s.group;
  EXPECT_EQ(e.probe->vae_image_mse, 0.0);
}

TEST_F(ZImageReport, EndToEndQ8IsCloserThanQ4) {
  auto reference = open_zimage();
  const Tokenizer tokenizer = zimage_tokenizer();
  Compute cx(2);
  Progress quiet;
  E2eSession session(*reference, tokenizer, cx, one_case(), quiet);
  std::map<std::string, E2eResult> by_type;
  for (const std::string type : {"q8", "q4"}) {
    auto candidate = open_model(container(type));
    by_type[type] = session.compare(*candidate, quiet);
    const E2eResult& e = by_type[type];
    const CaseResult& c = e.cases[0];
    EXPECT_GT(c.context.nmse, 0.0) << type;
    EXPECT_GT(c.final_latents.nmse, 0.0) << type;
    EXPECT_TRUE(std::isfinite(c.psnr_db)) << type;
    EXPECT_LT(c.ssim, 1.0) << type;
    EXPECT_EQ(c.reference_image.width, 64);
    EXPECT_EQ(c.difference_image.width, 64);
    ASSERT_TRUE(e.probe) << type;
    const BlockProbe& p = *e.probe;
    ASSERT_EQ(p.blocks.size(), kBlocks.size());
    // The first block of each stream sees the same input in both probes (the shared unit,
    // the embedders, stays bf16; the refiners see only their own stream), so its accumulated
    // and isolated errors are the same numbers; the main layers' accumulated errors carry
    // what both refiners passed on.
    for (size_t first : {size_t(0), size_t(2)})
      EXPECT_DOUBLE_EQ(p.blocks[first].accumulated->nmse, p.blocks[first].isolated->nmse)
          << type << " " << p.blocks[first].name;
    EXPECT_GT(p.blocks[4].accumulated->nmse, p.blocks[4].isolated->nmse) << type;
    for (const auto& b : p.blocks) EXPECT_GT(b.isolated->nmse, 0.0) << type << " " << b.name;
    // One isolated run per transformer unit (the blocks and the shared unit), plus the text
    // encoder; each quantized unit moves the velocity.
    ASSERT_EQ(p.sensitivities.size(), kBlocks.size() + 1 + 1);
    EXPECT_EQ(p.sensitivities.back().group, "text_encoder");
    for (const auto& s : p.sensitivities) {
      if (s.group != "transformer.shared") {
        EXPECT_GT(s.velocity_nmse, 0.0) << type << " " << s.group;
      }
    }
    ASSERT_TRUE(p.velocity);
    EXPECT_GT(p.velocity->nmse, 0.0);
  }
  const CaseResult &q8 = by_type["q8"].cases[0], &q4 = by_type["q4"].cases[0];
  std::printf("    PSNR q8 %.2f dB, q4 %.2f dB\n", q8.psnr_db, q4.psnr_db);
  EXPECT_GT(q8.psnr_db, q4.psnr_db + 6);
  EXPECT_LT(q8.context.nmse, q4.context.nmse);
  EXPECT_LT(q8.final_latents.nmse, q4.final_latents.nmse);
  EXPECT_LT(by_type["q8"].probe->velocity->nmse, by_type["q4"].probe->velocity->nmse);
}

// The report measures what `klein generate` makes: its image PSNR for the Q4 container equals
// the PSNR between two default generations (directory and container, same prompt, seed and
// size, each at the precision generate picks for it) within 0.5 dB.
TEST_F(ZImageReport, EndToEndPsnrIsThatOfTwoDefaultGenerations) {
  auto reference = open_zimage();
  auto candidate = open_model(container("q4"));
  const Tokenizer tokenizer = zimage_tokenizer();
  Compute cx(2);
  Progress quiet;
  const E2eResult e =
      run_e2e(*reference, *candidate, tokenizer, cx, one_case(BlockProbes::None), quiet);
  ASSERT_EQ(e.cases.size(), 1u);
  EXPECT_FALSE(e.probe);
  EXPECT_EQ(e.candidate_fast, runs_fast(Precision::Auto, *candidate));

  const E2eCase& c = e.cases[0].spec;
  const GenerateOptions g{.prompt = c.prompt, .width = c.width, .height = c.height, .seed = c.seed};
  Image images[2];
  for (int i = 0; i < 2; ++i) {
    Session session(i == 0 ? *reference : *candidate, tokenizer, cx);
    images[i] = session.generate(g, quiet).image;
  }
  ASSERT_EQ(images[0].rgb.size(), images[1].rgb.size());
  double squared = 0;
  for (size_t k = 0; k < images[0].rgb.size(); ++k) {
    const double d = (double(images[0].rgb[k]) - images[1].rgb[k]) / 255.0;
    squared += d * d;
  }
  ASSERT_GT(squared, 0.0) << "Q4 changed no pixel";
  const double generate_psnr = 10 * std::log10(double(images[0].rgb.size()) / squared);
  std::printf("    report PSNR %.2f dB, two generations %.2f dB\n", e.cases[0].psnr_db,
              generate_psnr);
  EXPECT_NEAR(e.cases[0].psnr_db, generate_psnr, 0.5);
  // The report's reference image is the generation's.
  EXPECT_EQ(e.cases[0].reference_image.rgb, images[0].rgb);
  EXPECT_EQ(e.cases[0].candidate_image.rgb, images[1].rgb);
}

// The CLI on the diffusers directory: the whole report (every tensor, the blocks by Z-Image's
// names, the images) and a policy proposal, converted and measured once, that `klein convert`
// accepts and that gives the types it lists.
TEST_F(ZImageReport, CliReportsAndVerifiesAPolicy) {
  const fs::path out = *dir_ / "out-q4";
  std::string log;
  const std::string args = "report -m " + testing::shell_arg(zimage_model()) + " --candidate " +
                           testing::shell_arg(container("q4")) + " -o " +
                           testing::shell_arg(out) +
                           " -p \"a red fox in fresh snow\" --seed 42 --target-psnr 40 "
                           "--verify-rounds 1 --threads 2";
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr("noise_refiner.0"));
  EXPECT_THAT(log, HasSubstr("Policy proposal"));

  const json j = json::parse(read_text_file(out / "report.json"));
  const container::ContainerFile f(container("q4"));
  std::set<std::string> expected, reported;
  for (const auto& t : f.index().tensors) expected.insert(t.name);
  for (const auto& t : j["tensors"]) reported.insert(t["name"].get<std::string>());
  EXPECT_EQ(reported, expected);
  ASSERT_EQ(j["e2e"]["cases"].size(), 1u);
  EXPECT_EQ(j["e2e"]["cases"][0]["steps"], 8);
  EXPECT_TRUE(j["e2e"]["cases"][0]["image"]["psnr_db"].is_number());
  std::vector<std::string> blocks;
  for (const auto& b : j["e2e"]["blocks"]["blocks"]) {
    blocks.push_back(b["name"].get<std::string>());
    EXPECT_TRUE(b["isolated"]["nmse"].is_number()) << b;
  }
  EXPECT_EQ(blocks, kBlocks);
  const std::string html = read_text_file(out / "report.html");
  for (const auto& b : kBlocks) EXPECT_THAT(html, HasSubstr(b));
  for (const char* name : {"case1-reference.png", "case1-candidate.png", "case1-difference.png",
                           "tensors.csv", "policy.txt"})
    EXPECT_TRUE(fs::exists(out / name)) << name;

  ASSERT_TRUE(j.contains("policy"));
  EXPECT_TRUE(j["policy"]["verified"].get<bool>());
  EXPECT_TRUE(j["policy"]["measured_psnr_db"].is_number());
  EXPECT_GT(j["policy"]["measured_psnr_db"].get<double>(),
            j["e2e"]["cases"][0]["image"]["psnr_db"].get<double>())
      << "the proposal keeps more precision than the all-Q4 candidate";
  const fs::path converted = *dir_ / "from-policy.klein";
  ASSERT_EQ(testing::run_klein("convert -q -m " + testing::shell_arg(zimage_model()) +
                                   " -t q4 --policy " + testing::shell_arg(out / "policy.txt") +
                                   " -o " + testing::shell_arg(converted),
                               &log),
            0)
      << log;
  const container::ContainerFile g(converted);
  std::map<std::string, std::string> stored;
  for (const auto& t : g.index().tensors) stored[t.name] = convert::storage_type_name(t.type);
  ASSERT_FALSE(j["policy"]["tensors"].empty());
  for (const auto& t : j["policy"]["tensors"])
    EXPECT_EQ(stored.at(t["name"].get<std::string>()), t["type"].get<std::string>());
}

// A container of the other family is no candidate for this reference: refused naming both
// families before any work, nothing written (bf16 containers: the family is all that counts).
TEST_F(ZImageReport, CandidateOfAnotherFamilyIsRefused) {
  const fs::path klein_bf16 = *dir_ / "klein-bf16.klein";
  ASSERT_TRUE(testing::convert_tiny(klein_bf16, "-t bf16"));
  const fs::path out = *dir_ / "out-mixed";
  std::string log;
  EXPECT_NE(testing::run_klein("report -q -m " + testing::shell_arg(zimage_model()) +
                                   " --candidate " + testing::shell_arg(klein_bf16) + " -o " +
                                   testing::shell_arg(out),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr(klein_bf16.string()));
  EXPECT_THAT(log, HasSubstr("is a FLUX.2-klein model and the reference"));
  EXPECT_THAT(log, HasSubstr("a Z-Image model"));
  EXPECT_FALSE(fs::exists(out));
  // The other way round too.
  EXPECT_NE(testing::run_klein("report -q -m " + testing::tiny_model().string() +
                                   " --candidate " + testing::shell_arg(container("bf16")) +
                                   " --no-e2e -o " + testing::shell_arg(out),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("is a Z-Image model and the reference"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace klein
