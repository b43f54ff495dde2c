// FP8 checkpoints end to end against tools/fp8/fp8_fixture.py, which writes the tiny
// transformer as fp8 in the published conventions (ComfyUI scaled fp8, weight_scale with
// per-row scales and comfy_quant records, unscaled E5M2) together with the reference: the same
// tensors holding the fp8 values times their scales, computed by numpy. Converting the fp8
// file must give the reference's weights bit for bit, and generating from the fp8 file (or its
// conversion) the reference's image.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>
#include "core/files.h"
#include "e2e/golden_dump.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

using testing::kSource;

using testing::shell_arg;
using testing::tiny_components;

using testing::kRun;

// The fixtures, made once for the program.
class Fp8Fixtures : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    if (!dir_.empty()) return;
    dir_ = testing::temp_dir("fp8-fixtures");
    // Debian's interpreter, where python3-numpy is installed (scripts/test.sh).
    const std::string cmd =
        "/usr/bin/python3 " + shell_arg(kSource / "tools" / "fp8" / "fp8_fixture.py") + " make " +
        shell_arg(testing::tiny_model() / "transformer" / "diffusion_pytorch_model.safetensors") +
        " " + shell_arg(dir_);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static fs::path fp8(const std::string& name) { return dir_ / (name + ".safetensors"); }
  static fs::path reference(const std::string& name) {
    return dir_ / ("reference-" + name + ".safetensors");
  }
  static fs::path dir_;
};
fs::path Fp8Fixtures::dir_;

class Fp8Checkpoint : public Fp8Fixtures, public ::testing::WithParamInterface<const char*> {};

// Every transformer tensor of two containers: the same type, shape and bytes.
void expect_same_transformer(const fs::path& a, const fs::path& b) {
  auto sa = open_model(a), sb = open_model(b);
  size_t compared = 0;
  for (const std::string& unit : sa->units()) {
    if (unit.rfind("transformer.", 0) != 0) continue;
    const UnitRef ua = sa->acquire(unit), ub = sb->acquire(unit);
    for (const Weight& wa : ua->weights()) {
      const Weight* wb = ub->find(wa.name.substr(ua->prefix().size()));
      ASSERT_NE(wb, nullptr) << wa.name;
      EXPECT_EQ(wa.dtype, wb->dtype) << wa.name;
      EXPECT_EQ(wa.shape, wb->shape) << wa.name;
      ASSERT_EQ(wa.nbytes, wb->nbytes) << wa.name;
      EXPECT_EQ(std::memcmp(wa.data, wb->data, wa.nbytes), 0) << wa.name;
      ++compared;
    }
  }
  EXPECT_GT(compared, 40u);
}

TEST_P(Fp8Checkpoint, ConvertsToTheReferenceWeights) {
  const std::string name = GetParam();
  const fs::path out = testing::temp_dir("fp8-convert-" + name);
  std::string log;
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(fp8(name)) + " -t f32 -q -o " +
                                   shell_arg(out / "fp8.klein"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(reference(name)) + " -t f32 -q -o " +
                                   shell_arg(out / "ref.klein"),
                               &log),
            0)
      << log;
  expect_same_transformer(out / "fp8.klein", out / "ref.klein");
}

TEST_P(Fp8Checkpoint, GeneratesTheReferenceImage) {
  const std::string name = GetParam();
  const fs::path out = testing::temp_dir("fp8-generate-" + name);
  std::string log;
  ASSERT_TRUE(testing::generate_compared_run(tiny_components(reference(name)), out, "ref"));
  // Straight from the fp8 file.
  ASSERT_TRUE(testing::generate_compared_run(tiny_components(fp8(name)), out, "fp8"));
  testing::expect_dump_matches(out / "fp8", out / "ref", {"final_latents"}, 4);
  testing::expect_png_matches(out / "fp8.png", out / "ref.png", 64, 64);
  // From its conversion.
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(fp8(name)) + " -t f32 -q -o " +
                                   shell_arg(out / "fp8.klein"),
                               &log),
            0)
      << log;
  ASSERT_TRUE(
      testing::generate_compared_run(" -m " + shell_arg(out / "fp8.klein"), out, "converted"));
  testing::expect_dump_matches(out / "converted", out / "ref", {"final_latents"}, 4);
  testing::expect_png_matches(out / "converted.png", out / "ref.png", 64, 64);
}

INSTANTIATE_TEST_SUITE_P(Conventions, Fp8Checkpoint,
                         ::testing::Values("comfy-scaled", "weight-scale", "e5m2"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

// -t keep: the reference file holds F32 matrices and BF16 norms, the fp8 file fp8 matrices.
TEST_F(Fp8Fixtures, KeepKeepsEachTensorsPrecisionClass) {
  const fs::path out = testing::temp_dir("fp8-keep");
  std::string log;
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(reference("comfy-scaled")) +
                                   " -t keep -q -o " + shell_arg(out / "ref.klein"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(fp8("comfy-scaled")) +
                                   " -t keep -q -o " + shell_arg(out / "fp8.klein"),
                               &log),
            0)
      << log;
  auto ref = open_model(out / "ref.klein"), q = open_model(out / "fp8.klein");
  const UnitRef r = ref->acquire("transformer.double.0"), f = q->acquire("transformer.double.0");
  EXPECT_EQ(r->get("attn.to_q.weight").dtype, DType::F32);
  EXPECT_EQ(r->get("attn.norm_q.weight").dtype, DType::BF16);
  EXPECT_EQ(f->get("attn.to_q.weight").dtype, DType::Q8);  // fp8 -> q8
  EXPECT_EQ(f->get("attn.norm_q.weight").dtype, DType::BF16);
  // The text encoder (BF16 in the tiny model) stays BF16, matrices included.
  const UnitRef t = q->acquire("text_encoder.layer.0");
  for (const Weight& w : t->weights()) EXPECT_EQ(w.dtype, DType::BF16) << w.name;
  ASSERT_EQ(testing::run_klein("inspect -m " + shell_arg(out / "fp8.klein"), &log), 0) << log;
  EXPECT_NE(log.find("target keep"), std::string::npos) << log;
}

// klein inspect lists the fp8 tensors by type and counts them as parameters; the scales and
// input scales are not unused tensors.
TEST_F(Fp8Fixtures, InspectListsThem) {
  std::string log;
  ASSERT_EQ(testing::run_klein("inspect --json" + tiny_components(fp8("comfy-scaled")), &log), 0)
      << log;
  const auto j = nlohmann::json::parse(log.substr(log.find('{')));
  const auto& t = j["components"][0];
  ASSERT_EQ(t["component"], "transformer");
  EXPECT_GT(t["dtypes"]["F8_E4M3"]["parameters"].get<int64_t>(), 6000000);
  EXPECT_EQ(t["dtypes"]["F8_E4M3"]["parameters"].get<int64_t>(),
            t["dtypes"]["F8_E4M3"]["bytes"].get<int64_t>());
  EXPECT_TRUE(t["unused_tensors"].empty()) << t["unused_tensors"].dump();
}

// klein report with the fp8 file as the reference.
TEST_F(Fp8Fixtures, ReportTakesItAsTheReference) {
  const fs::path out = testing::temp_dir("fp8-report");
  std::string log;
  ASSERT_EQ(testing::run_klein("convert" + tiny_components(fp8("comfy-scaled")) + " -t q8 -q -o " +
                                   shell_arg(out / "q8.klein"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("report" + tiny_components(fp8("comfy-scaled")) + " --candidate " +
                                   shell_arg(out / "q8.klein") + " --no-e2e --json -q",
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("transformer.transformer_blocks.0.attn.to_q.weight"), std::string::npos);
}

}  // namespace
}  // namespace klein
