// klein report: the metrics on inputs whose answers are worked out by hand, the tensor
// comparison and the end-to-end comparison on the tiny model at Q8 and Q4, the policy
// search, and the CLI's outputs (JSON with every tensor, CSV, HTML whose SVG is well-formed
// XML, a policy file `klein convert` accepts).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <cctype>
#include <regex>
#include <set>
#include <vector>

#include <unistd.h>

#include "convert/convert.h"
#include "convert/policy.h"
#include "core/error.h"
#include "core/files.h"
#include "formats/container/reader.h"
#include "formats/image/image.h"
#include "pipeline/model_tokenizer.h"
#include "quant/matmul.h"
#include "convert/report/e2e.h"
#include "convert/report/metrics.h"
#include "convert/report/mixed_store.h"
#include "convert/report/policy_search.h"
#include "convert/report/weights.h"
#include "convert/report/writers.h"
#include "support/testing.h"
#include "support/tiny_container.h"
#include "weights/model_source.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace report;

constexpr double kInf = std::numeric_limits<double>::infinity();

Tokenizer tiny_tokenizer() {
  ModelPaths paths;
  paths.model = testing::tiny_model();
  return load_model_tokenizer(paths);
}

// --- metrics: values worked out by hand ---------------------------------------------------

TEST(Metrics, IdenticalValuesHaveInfiniteSnrAndCosineOne) {
  const std::vector<float> a = {0.5f, -1.25f, 3.0f, 0.0f, 7.5f};
  const ErrorSummary e = compare(a.data(), a.data(), int64_t(a.size()));
  EXPECT_EQ(e.rmse, 0.0);
  EXPECT_EQ(e.nmse, 0.0);
  EXPECT_EQ(e.snr_db, kInf);
  EXPECT_EQ(e.cosine, 1.0);
  EXPECT_EQ(e.max_abs, 0.0);
  EXPECT_EQ(e.count, 5);
}

TEST(Metrics, KnownPerturbation) {
  // d = c - r = [0.5, 0, 0, -1]: Σd² = 1.25, Σr² = 30, Σc² = 24.25, Σrc = 26.5.
  const std::vector<float> r = {1, 2, 3, 4}, c = {1.5f, 2, 3, 3};
  const ErrorSummary e = compare(r.data(), c.data(), 4);
  EXPECT_DOUBLE_EQ(e.rmse, std::sqrt(1.25 / 4));
  EXPECT_DOUBLE_EQ(e.nmse, 1.25 / 30);
  EXPECT_NEAR(e.snr_db, 10 * std::log10(24.0), 1e-12);
  EXPECT_NEAR(e.cosine, 26.5 / std::sqrt(30 * 24.25), 1e-15);
  EXPECT_EQ(e.max_abs, 1.0);
}

TEST(Metrics, ConstantOffsetGivesItsRmse) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> r(100000), c(r.size());
  for (size_t i = 0; i < r.size(); ++i) {
    // Multiples of 1/1024, so that r ± 1/8 is exact in float.
    r[i] = std::round(normal(rng) * 1024) / 1024;
    c[i] = i % 2 ? r[i] + 0.125f : r[i] - 0.125f;
  }
  const ErrorSummary e = compare(r.data(), c.data(), int64_t(r.size()));
  EXPECT_NEAR(e.rmse, 0.125, 1e-12);
  EXPECT_EQ(e.max_abs, 0.125);
}

TEST(Metrics, ZeroReferenceAndMerging) {
  const std::vector<float> zero(8, 0.0f), ones(8, 1.0f);
  EXPECT_EQ(compare(zero.data(), ones.data(), 8).nmse, kInf);
  EXPECT_EQ(compare(zero.data(), ones.data(), 8).cosine, 0.0);
  EXPECT_EQ(compare(zero.data(), zero.data(), 8).cosine, 1.0);
  // Stats of two halves merged = stats of the whole.
  const std::vector<float> r = {1, 2, 3, 4, 5, 6}, c = {1, 2.5f, 3, 3, 5, 7};
  ErrorStats a, b, whole;
  a.add(r.data(), c.data(), 2);
  b.add(r.data() + 2, c.data() + 2, 4);
  a.merge(b);
  whole.add(r.data(), c.data(), 6);
  EXPECT_DOUBLE_EQ(a.nmse(), whole.nmse());
  EXPECT_DOUBLE_EQ(a.cosine(), whole.cosine());
  EXPECT_EQ(a.max_abs_error(), whole.max_abs_error());
  EXPECT_EQ(a.count(), 6);
}

TEST(Metrics, HistogramBinsRelativeToTheRowRms) {
  // Row RMS = 1; errors 0, 1.5e-3, 0.5, 20 -> exact, bin floor((log10(1.5e-3) + 6) * 4) = 12,
  // bin floor((log10(0.5) + 6) * 4) = 22, above.
  const std::vector<float> r = {1, -1, 1, -1}, c = {1, -1 + 1.5e-3f, 1.5f, 19};
  ErrorHistogram h;
  h.add_row(r.data(), c.data(), 4);
  EXPECT_EQ(h.exact(), 1);
  EXPECT_EQ(h.above(), 1);
  EXPECT_EQ(h.total(), 4);
  for (int i = 0; i < ErrorHistogram::kBins; ++i)
    EXPECT_EQ(h.bins()[size_t(i)], i == 12 || i == 22 ? 1 : 0) << "bin " << i;
  EXPECT_DOUBLE_EQ(ErrorHistogram::bin_lower(12), 1e-3);
}

TEST(Metrics, PsnrOfAKnownOffset) {
  std::vector<float> a(300, 0.5f), b(300, 0.6f);
  EXPECT_NEAR(psnr_db(a.data(), b.data(), 300), 20.0, 1e-5);  // MSE 0.01
  EXPECT_EQ(psnr_db(a.data(), a.data(), 300), kInf);
}

// SSIM of two constant images: every window has σ = 0, so SSIM = (2ab + C1) / (a² + b² + C1).
TEST(Metrics, SsimOfConstantImages) {
  const double a = 0.3, b = 0.7, c1 = 1e-4;
  const double expected = (2 * a * b + c1) / (a * a + b * b + c1);
  for (int side : {32, 6}) {  // through the window, and the whole-image fallback
    std::vector<float> x(size_t(3 * side * side), float(a)), y(x.size(), float(b));
    EXPECT_NEAR(ssim(x.data(), y.data(), 3, side, side), expected, 1e-6) << side;
    EXPECT_NEAR(ssim(x.data(), x.data(), 3, side, side), 1.0, 1e-12) << side;
  }
}

// The separable implementation against a direct sum over every 11x11 window.
TEST(Metrics, SsimMatchesADirectWindowSum) {
  const int H = 20, W = 23;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> x(size_t(H * W)), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = u(rng);
    y[i] = std::clamp(x[i] + 0.2f * (u(rng) - 0.5f), 0.0f, 1.0f);
  }
  double g[11], sum = 0;
  for (int i = 0; i < 11; ++i) sum += g[i] = std::exp(-(i - 5.0) * (i - 5.0) / (2 * 1.5 * 1.5));
  double total = 0;
  int windows = 0;
  for (int y0 = 0; y0 + 11 <= H; ++y0)
    for (int x0 = 0; x0 + 11 <= W; ++x0) {
      double mx = 0, my = 0, xx = 0, yy = 0, xy = 0;
      for (int i = 0; i < 11; ++i)
        for (int j = 0; j < 11; ++j) {
          const double w = g[i] * g[j] / (sum * sum);
          const double a = x[size_t((y0 + i) * W + x0 + j)], b = y[size_t((y0 + i) * W + x0 + j)];
          mx += w * a, my += w * b, xx += w * a * a, yy += w * b * b, xy += w * a * b;
        }
      const double c1 = 1e-4, c2 = 9e-4;
      total += (2 * mx * my + c1) * (2 * (xy - mx * my) + c2) /
               ((mx * mx + my * my + c1) * (xx - mx * mx + yy - my * my + c2));
      ++windows;
    }
  EXPECT_NEAR(ssim(x.data(), y.data(), 1, H, W), total / windows, 1e-10);
}

TEST(Metrics, SizesParse) {
  EXPECT_EQ(parse_size("2.5GB", "--max-size"), 2500000000u);
  EXPECT_EQ(parse_size("800mb", "--max-size"), 800000000u);
  EXPECT_EQ(parse_size("123456", "--max-size"), 123456u);
  EXPECT_EQ(parse_size("1MiB", "--max-size"), 1048576u);
  EXPECT_THROW(parse_size("lots", "--max-size"), Error);
  EXPECT_THROW(parse_size("3 parsecs", "--max-size"), Error);
}

// --- the tiny model at Q8 and Q4 -------------------------------------------------------------

class TinyReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fs::path(testing::temp_dir("report")); }
  // Converted once per test run (testing::shared_tiny_container).
  static fs::path container(const std::string& type) {
    return testing::shared_tiny_container(type);
  }
  static std::set<std::string> tensor_names(const fs::path& file) {
    const container::ContainerFile f(file);
    std::set<std::string> names;
    for (const auto& t : f.index().tensors) names.insert(t.name);
    return names;
  }
  static E2eOptions one_case(BlockProbes blocks = BlockProbes::Both) {
    auto store = open_model(testing::tiny_model());
    E2eOptions o;
    o.cases = make_cases(store->config(), {"a red fox in fresh snow"}, {42}, 0, 0, 0);
    o.blocks = blocks;
    return o;
  }
  static fs::path* dir_;
};
fs::path* TinyReport::dir_ = nullptr;

TEST_F(TinyReport, DefaultCasesAreSmallForTheTinyModel) {
  auto store = open_model(testing::tiny_model());
  const auto cases = make_cases(store->config(), {}, {}, 0, 0, 0);
  ASSERT_EQ(cases.size(), 2u);
  EXPECT_EQ(cases[0].width, 64);
  EXPECT_EQ(cases[0].height, 64);
  EXPECT_NE(cases[0].seed, cases[1].seed);
  const auto mine = make_cases(store->config(), {"a", "b", "c"}, {1, 2}, 128, 0, 2);
  ASSERT_EQ(mine.size(), 3u);
  EXPECT_EQ(mine[2].seed, 2u);  // the last seed repeats
  EXPECT_EQ(mine[0].width, 128);
  EXPECT_EQ(mine[0].height, 64);
  EXPECT_THROW(make_cases(store->config(), {}, {}, 100, 0, 0), Error);
}

TEST_F(TinyReport, EveryTensorIsComparedAndQ4CostsMoreThanQ8) {
  auto reference = open_model(testing::tiny_model());
  Compute cx(2);
  std::map<std::string, WeightComparison> by_type;
  for (const std::string type : {"q8", "q4"}) {
    auto candidate = open_model(container(type));
    const WeightComparison w = compare_weights(*reference, *candidate, cx);
    std::set<std::string> compared;
    for (const auto& t : w.tensors) compared.insert(t.name);
    EXPECT_EQ(compared, tensor_names(container(type))) << type;
    EXPECT_EQ(w.total.tensors, w.tensors.size());
    for (size_t i = 1; i < w.tensors.size(); ++i)
      EXPECT_GE(w.tensors[i - 1].error.nmse, w.tensors[i].error.nmse) << "worst first";
    for (const auto& t : w.tensors) {
      if (t.type == DType::BF16) {
        // Stored as the reference stores it: bit-identical.
        EXPECT_EQ(t.error.snr_db, kInf) << t.name;
        EXPECT_EQ(t.error.cosine, 1.0) << t.name;
        EXPECT_DOUBLE_EQ(t.bits_per_weight(), 16.0) << t.name;
      } else {
        EXPECT_GT(t.error.nmse, 0.0) << t.name;
        EXPECT_GT(t.error.cosine, 0.99) << t.name;
        EXPECT_DOUBLE_EQ(t.bits_per_weight(), t.type == DType::Q8 ? 8.5 : 4.5) << t.name;
      }
    }
    int64_t histogram_total = 0;
    for (const auto& t : w.tensors) histogram_total += t.numel();
    EXPECT_EQ(w.histogram.total(), histogram_total);
    by_type[type] = w;
  }
  // Q4 keeps 3 bits fewer than Q8 per weight: its worst error is hundreds of times larger.
  const double q8 = by_type["q8"].tensors.front().error.nmse;
  const double q4 = by_type["q4"].tensors.front().error.nmse;
  EXPECT_GT(q4, 50 * q8);
  EXPECT_LT(q8, 1e-3);
}

// One tensor's figures recomputed here by dequantizing it whole.
TEST_F(TinyReport, ATensorsRmseMatchesADirectComputation) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(container("q4"));
  Compute cx(2);
  const WeightComparison w = compare_weights(*reference, *candidate, cx);
  const std::string name = "transformer.single_transformer_blocks.1.attn.to_out.weight";
  const auto it = std::find_if(w.tensors.begin(), w.tensors.end(),
                               [&](const TensorError& t) { return t.name == name; });
  ASSERT_NE(it, w.tensors.end());
  const UnitRef r = reference->acquire("transformer.single.1");
  const UnitRef c = candidate->acquire("transformer.single.1");
  auto dequantized = [](const Weight& x) {
    quant::Matrix m{x.dtype, quant::Layout(x.layout), x.rows(), x.cols(), x.data, x.nbytes};
    std::vector<float> out(size_t(x.numel()));
    quant::unpack_rows(m, 0, x.rows(), out.data());
    return out;
  };
  const std::vector<float> a = dequantized(r->get("attn.to_out.weight"));
  const std::vector<float> b = dequantized(c->get("attn.to_out.weight"));
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err2 += (double(b[i]) - a[i]) * (double(b[i]) - a[i]);
    ref2 += double(a[i]) * a[i];
    max_abs = std::max(max_abs, std::fabs(double(b[i]) - a[i]));
  }
  EXPECT_NEAR(it->error.rmse, std::sqrt(err2 / double(a.size())), 1e-12);
  EXPECT_NEAR(it->error.nmse, err2 / ref2, 1e-12);
  EXPECT_EQ(it->error.max_abs, max_abs);
  EXPECT_EQ(it->type, DType::Q4);
}

TEST_F(TinyReport, AlternativesReproduceTheConvertersQuantization) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(container("q8"));
  Compute cx(2);
  CompareOptions o;
  o.alternatives = true;
  const WeightComparison w = compare_weights(*reference, *candidate, cx, o);
  for (const auto& t : w.tensors) {
    for (const auto& a : t.alternatives)
      if (a.type == t.type) {
        EXPECT_NEAR(a.nmse, t.error.nmse, 1e-9 * (1 + t.error.nmse)) << t.name;
        EXPECT_EQ(a.bytes, t.bytes) << t.name;
      }
  }
}

TEST_F(TinyReport, ReferenceMustNotBeQuantizedAndModelsMustMatch) {
  auto q4 = open_model(container("q4"));
  auto q8 = open_model(container("q8"));
  Compute cx(1);
  try {
    compare_weights(*q4, *q8, cx);
    FAIL() << "a quantized reference was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("reference tensor"));
    EXPECT_THAT(e.what(), HasSubstr("Q4"));
  }
}

TEST_F(TinyReport, MixedStoreTakesOnlyTheChosenUnitsFromTheCandidate) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(container("q4"));
  MixedStore mixed(*reference, *candidate, {"transformer.double.1"});
  EXPECT_EQ(mixed.acquire("transformer.double.1")->get("attn.to_q.weight").dtype, DType::Q4);
  EXPECT_EQ(mixed.acquire("transformer.double.0")->get("attn.to_q.weight").dtype, DType::BF16);
  EXPECT_THROW(MixedStore(*reference, *candidate, {"text_encoder.layer.27"}), Error);
}

TEST_F(TinyReport, AModelAgainstItselfHasNoError) {
  auto reference = open_model(testing::tiny_model());
  const Tokenizer tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  const E2eResult e = run_e2e(*reference, *reference, tokenizer, cx, one_case(), quiet);
  ASSERT_EQ(e.cases.size(), 1u);
  const CaseResult& c = e.cases[0];
  EXPECT_EQ(c.context.nmse, 0.0);
  EXPECT_EQ(c.final_latents.nmse, 0.0);
  EXPECT_EQ(c.psnr_db, kInf);
  EXPECT_NEAR(c.ssim, 1.0, 1e-12);
  EXPECT_EQ(c.text_layers.size(), size_t(reference->config().text_encoder.layers_needed()));
  ASSERT_TRUE(e.probe);
  for (const auto& b : e.probe->blocks) {
    EXPECT_EQ(b.accumulated->nmse, 0.0) << b.name;
    EXPECT_EQ(b.isolated->nmse, 0.0) << b.name;
  }
  for (const auto& s : e.probe->sensitivities) EXPECT_EQ(s.velocity_nmse, 0.0) << s.group;
}

// The report measures what `klein generate` makes: its image PSNR for a Q4 container equals
// the PSNR between two default generations (the safetensors and the container, same prompt,
// seed and size, each at the precision generate picks for it) within 0.5 dB, and it names
// the precision of each model.
TEST_F(TinyReport, EndToEndPsnrIsThatOfTwoDefaultGenerations) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(container("q4"));
  const Tokenizer tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  const E2eOptions options = one_case(BlockProbes::None);
  const E2eResult e = run_e2e(*reference, *candidate, tokenizer, cx, options, quiet);
  ASSERT_EQ(e.cases.size(), 1u);
  EXPECT_EQ(e.reference_fast, runs_fast(Precision::Auto, *reference));
  EXPECT_EQ(e.candidate_fast, runs_fast(Precision::Auto, *candidate));
  EXPECT_TRUE(e.candidate_fast || !cx.amx());  // Q4: fast where the CPU has AMX

  const E2eCase& c = e.cases[0].spec;
  const GenerateOptions g{
      .prompt = c.prompt, .width = c.width, .height = c.height, .steps = c.steps, .seed = c.seed};
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
  const double generate_psnr = 10 * std::log10(double(images[0].rgb.size()) / squared);
  std::printf("    report PSNR %.2f dB, two generations %.2f dB\n", e.cases[0].psnr_db,
              generate_psnr);
  EXPECT_NEAR(e.cases[0].psnr_db, generate_psnr, 0.5);

  Report r;
  r.e2e = e;
  const nlohmann::ordered_json j = report_json(r);
  EXPECT_EQ(j["e2e"]["precision"]["candidate"], precision_name(e.candidate_fast));
  EXPECT_EQ(j["e2e"]["precision"]["reference"], precision_name(e.reference_fast));
}

TEST_F(TinyReport, EndToEndQ8IsCloserThanQ4) {
  auto reference = open_model(testing::tiny_model());
  const Tokenizer tokenizer = tiny_tokenizer();
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
    EXPECT_TRUE(std::isfinite(c.psnr_db)) << type;
    EXPECT_GT(c.ssim, 0.5) << type;
    EXPECT_LT(c.ssim, 1.0) << type;
    EXPECT_EQ(c.step_latents.size(), size_t(c.spec.steps));
    EXPECT_EQ(c.reference_image.width, 64);
    EXPECT_EQ(c.difference_image.width, 64);
    ASSERT_TRUE(e.probe) << type;
    const BlockProbe& p = *e.probe;
    ASSERT_EQ(p.blocks.size(), 4u);
    // The first block sees the same input in both probes (the shared unit stays bf16), so
    // its accumulated and isolated errors are the same numbers.
    EXPECT_DOUBLE_EQ(p.blocks[0].accumulated->nmse, p.blocks[0].isolated->nmse) << type;
    for (const auto& b : p.blocks) EXPECT_GT(b.isolated->nmse, 0.0) << type << " " << b.name;
    // One isolated run per transformer unit, plus the text encoder.
    EXPECT_EQ(p.sensitivities.size(), 4u + 1 + 1);
    EXPECT_EQ(p.sensitivities.back().group, "text_encoder");
    // The VAE's weights stay bf16: its image error is only that of the arithmetic. Where the
    // candidate runs the fast arithmetic and the reference the exact one, the convolutions
    // differ on every CPU (bf16 products on AMX or AVX-512 BF16, float32 Winograd elsewhere):
    // small, not zero. The same arithmetic gives the same bits.
    if (e.candidate_fast != e.reference_fast) {
      EXPECT_GT(p.vae_image_mse, 0.0) << type;
      EXPECT_LT(p.vae_image_mse, 1e-4) << type;
    } else {
      EXPECT_EQ(p.vae_image_mse, 0.0) << type << ": the VAE stays bf16";
    }
  }
  EXPECT_GT(by_type["q8"].cases[0].psnr_db, by_type["q4"].cases[0].psnr_db + 6);
  EXPECT_LT(by_type["q8"].cases[0].context.nmse, by_type["q4"].cases[0].context.nmse);
}

// --- policy search ---------------------------------------------------------------------------

struct Measured {
  WeightComparison weights;
  E2eResult e2e;
  SizeModel size;
};

Measured measure_q4(const fs::path& candidate_file) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(candidate_file);
  const Tokenizer tokenizer = tiny_tokenizer();
  Compute cx(2);
  Progress quiet;
  Measured m;
  CompareOptions o;
  o.alternatives = true;
  m.weights = compare_weights(*reference, *candidate, cx, o);
  E2eOptions e;
  e.cases = make_cases(reference->config(), {"a red fox in fresh snow"}, {42}, 0, 0, 0);
  m.e2e = run_e2e(*reference, *candidate, tokenizer, cx, e, quiet);
  const container::ContainerFile f(candidate_file);
  m.size.file_bytes = fs::file_size(candidate_file);
  m.size.alignment = f.header().alignment;
  for (const auto& u : f.index().units) m.size.unit_bytes[u.name] = u.size;
  return m;
}

// One measurement of the Q4 candidate, then several searches on it (measuring is the slow
// part).
TEST_F(TinyReport, PolicySearch) {
  const Measured m = measure_q4(container("q4"));
  const double start = psnr_from_mse(m.e2e.mean_image_mse);
  {
    SCOPED_TRACE("a goal the all-q4 start already meets");
    // No upgrade, so the prediction is the candidate's own measured figures (the
    // calibration makes them equal).
    PolicyGoal goal;
    goal.min_psnr_db = 1.0;
    const PolicyProposal p = search_policy(m.weights, m.e2e, goal, m.size);
    EXPECT_TRUE(p.met);
    EXPECT_NEAR(p.predicted_psnr_db, start, 1e-9);
    EXPECT_EQ(p.predicted_file_bytes, m.size.file_bytes);
    for (const auto& t : p.tensors) EXPECT_EQ(t.type, t.candidate) << t.name;
  }
  {
    SCOPED_TRACE("a size budget");
    PolicyGoal goal;
    goal.max_bytes = m.size.file_bytes + 1000000;
    const PolicyProposal p = search_policy(m.weights, m.e2e, goal, m.size);
    EXPECT_TRUE(p.met);
    EXPECT_LE(p.predicted_file_bytes, *goal.max_bytes);
    EXPECT_GT(p.predicted_psnr_db, start);
    PolicyGoal tiny;
    tiny.max_bytes = 1000;
    EXPECT_FALSE(search_policy(m.weights, m.e2e, tiny, m.size).met);
  }
  SCOPED_TRACE("a PSNR goal 6 dB above the candidate");
  PolicyGoal goal;
  goal.min_psnr_db = start + 6;
  const PolicyProposal p = search_policy(m.weights, m.e2e, goal, m.size);
  EXPECT_TRUE(p.met);
  EXPECT_GE(p.predicted_psnr_db, start + 6);
  EXPECT_GT(p.predicted_file_bytes, m.size.file_bytes);
  size_t upgraded = 0;
  for (const auto& t : p.tensors) upgraded += t.type != t.minimum;
  EXPECT_GT(upgraded, 0u);

  // A stricter goal costs more bytes.
  PolicyGoal stricter;
  stricter.min_psnr_db = start + 12;
  EXPECT_GT(search_policy(m.weights, m.e2e, stricter, m.size).predicted_file_bytes,
            p.predicted_file_bytes);

  // The policy file parses, and converting with it gives exactly the proposed types in a
  // file of the predicted size.
  const auto rules = convert::PrecisionPolicy::with_user_rules(p.text, "proposal");
  for (const auto& t : p.tensors) {
    const auto it = std::find_if(m.weights.tensors.begin(), m.weights.tensors.end(),
                                 [&](const TensorError& x) { return x.name == t.name; });
    EXPECT_EQ(rules.choose(t.name, it->shape, DType::Q4).type, t.type) << t.name;
  }
  convert::ConvertOptions o;
  o.source.model = testing::tiny_model();
  o.output = *dir_ / "proposal.klein";
  o.target = DType::Q4;
  o.policy_text = p.text;
  o.policy_origin = "proposal";
  convert::convert_model(o);
  // Exact but for the metadata, which records the policy text (compressed).
  EXPECT_NEAR(double(fs::file_size(o.output)), double(p.predicted_file_bytes), 16384);
  const container::ContainerFile f(o.output);
  std::map<std::string, DType> stored;
  for (const auto& t : f.index().tensors) stored[t.name] = t.type;
  for (const auto& t : p.tensors) EXPECT_EQ(stored.at(t.name), t.type) << t.name;
}

// --- the CLI -----------------------------------------------------------------------------------

// (whitespace name = "value" | 'value')* whitespace? "/"?, values without '<'. Hand-written:
// std::regex recurses once per character and overflowed the stack (under ASan) on the long
// base64 attribute of an embedded image.
bool attributes_are_well_formed(const std::string& r) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  const auto name_start = [](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; };
  const auto name_char = [&](char c) {
    return name_start(c) || std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '.';
  };
  size_t i = 0;
  const size_t n = r.size();
  const auto skip_space = [&] {
    const size_t start = i;
    while (i < n && space(r[i])) ++i;
    return i > start;
  };
  while (true) {
    const bool separated = skip_space();
    if (i == n) return true;
    if (r[i] == '/') return i + 1 == n;
    if (!separated || !name_start(r[i])) return false;
    while (i < n && name_char(r[i])) ++i;
    skip_space();
    if (i == n || r[i] != '=') return false;
    ++i;
    skip_space();
    if (i == n || (r[i] != '"' && r[i] != '\'')) return false;
    const char quote = r[i++];
    const size_t end = r.find(quote, i);
    if (end == std::string::npos || r.find('<', i) < end) return false;
    i = end + 1;
  }
}

// A minimal XML well-formedness check: balanced, properly nested tags, quoted attributes,
// only the five XML entities or numeric references. Returns "" or what is wrong.
std::string xml_problem(const std::string& s) {
  static const std::regex entity("&(amp|lt|gt|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);");
  std::vector<std::string> open;
  size_t i = 0;
  auto check_text = [&](const std::string& text) -> std::string {
    for (size_t k = text.find('&'); k != std::string::npos; k = text.find('&', k + 1)) {
      std::smatch m;
      const std::string rest = text.substr(k, 12);
      if (!std::regex_search(rest, m, entity) || m.position(0) != 0)
        return "bad entity near \"" + rest + "\"";
    }
    return "";
  };
  while (i < s.size()) {
    const size_t lt = s.find('<', i);
    const std::string text = s.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    if (auto p = check_text(text); !p.empty()) return p;
    if (lt == std::string::npos) break;
    if (s.compare(lt, 4, "<!--") == 0) {
      const size_t end = s.find("-->", lt);
      if (end == std::string::npos) return "unclosed comment";
      i = end + 3;
      continue;
    }
    const size_t gt = s.find('>', lt);
    if (gt == std::string::npos) return "unclosed tag at " + std::to_string(lt);
    const std::string tag = s.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag.starts_with("!") || tag.starts_with("?")) continue;  // doctype, declaration
    if (tag.starts_with("/")) {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes <" + (open.empty() ? "" : open.back()) + ">";
      open.pop_back();
      continue;
    }
    const size_t name_end = tag.find_first_of(" \t\n/");
    const std::string name = tag.substr(0, name_end);
    if (name.empty()) return "empty tag name at " + std::to_string(lt);
    const std::string rest = name_end == std::string::npos ? "" : tag.substr(name_end);
    if (!attributes_are_well_formed(rest)) return "bad attributes in <" + tag + ">";
    if (auto p = check_text(rest); !p.empty()) return p;
    if (!tag.ends_with("/")) open.push_back(name);
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

TEST(XmlCheck, FindsWhatIsWrong) {
  EXPECT_EQ(xml_problem("<svg a=\"1\"><rect x=\"0\"/><text>a &amp; b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><rect></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg x=1></svg>"), "");
  EXPECT_NE(xml_problem("<svg>"), "");
  EXPECT_EQ(xml_problem("<svg><rect x=\"0\" /><g c='1'/></svg>"), "");
  EXPECT_NE(xml_problem("<svg a=\"1\"b=\"2\"></svg>"), "");
  EXPECT_NE(xml_problem("<svg a=\"<\"></svg>"), "");
  // An embedded image's attribute can be megabytes long.
  EXPECT_EQ(xml_problem("<img src=\"" + std::string(4 << 20, 'A') + "\"/>"), "");
}

std::string read(const fs::path& p) { return read_text_file(p); }

void check_cli_report(const fs::path& candidate, const fs::path& out) {
  std::string log;
  const std::string args = "report -q -m " + testing::tiny_model().string() + " --candidate " +
                           candidate.string() + " -o " + out.string() +
                           " -p \"a red fox in fresh snow\" --seed 42 --json";
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;

  const json j = json::parse(read(out / "report.json"));
  const container::ContainerFile f(candidate);
  std::set<std::string> expected, reported;
  for (const auto& t : f.index().tensors) expected.insert(t.name);
  for (const auto& t : j["tensors"]) {
    reported.insert(t["name"].get<std::string>());
    for (const char* key : {"rmse", "nmse", "cosine", "max_abs_error", "bits_per_weight"})
      EXPECT_TRUE(t.contains(key)) << key;
  }
  EXPECT_EQ(reported, expected);
  EXPECT_EQ(j["tensors"].size(), expected.size());
  EXPECT_EQ(j["e2e"]["cases"].size(), 1u);
  EXPECT_TRUE(j["e2e"]["cases"][0]["image"]["psnr_db"].is_number());
  EXPECT_EQ(j["e2e"]["blocks"]["blocks"].size(), 4u);
  // --json prints the same document on stdout.
  EXPECT_THAT(log, HasSubstr("\"format\": \"klein-report\""));

  // CSV: a header and one row per tensor.
  const std::string csv = read(out / "tensors.csv");
  EXPECT_EQ(size_t(std::count(csv.begin(), csv.end(), '\n')), expected.size() + 1);

  // HTML: the whole page and every SVG in it are well-formed XML; the images are embedded.
  const std::string html = read(out / "report.html");
  EXPECT_EQ(xml_problem(html), "");
  size_t svgs = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    const size_t end = html.find("</svg>", at);
    ASSERT_NE(end, std::string::npos);
    EXPECT_EQ(xml_problem(html.substr(at, end + 6 - at)), "") << "SVG " << svgs;
    ++svgs;
  }
  EXPECT_GE(svgs, 5u);  // units, worst tensors, histogram, text layers, blocks, velocity
  EXPECT_EQ(size_t(std::count(html.begin(), html.end(), '<') -
                   std::count(html.begin(), html.end(), '>')), 0u);
  EXPECT_THAT(html, HasSubstr("src=\"data:image/png;base64,iVBORw0KGgo"));
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  for (const char* name : {"case1-reference.png", "case1-candidate.png", "case1-difference.png",
                           "e2e.csv", "units.csv"})
    EXPECT_TRUE(fs::exists(out / name)) << name;
}

TEST_F(TinyReport, CliReportsQ8AndQ4) {
  check_cli_report(container("q8"), *dir_ / "out-q8");
  check_cli_report(container("q4"), *dir_ / "out-q4");
  const json q8 = json::parse(read(*dir_ / "out-q8" / "report.json"));
  const json q4 = json::parse(read(*dir_ / "out-q4" / "report.json"));
  EXPECT_GT(q8["e2e"]["cases"][0]["image"]["psnr_db"].get<double>(),
            q4["e2e"]["cases"][0]["image"]["psnr_db"].get<double>());
  EXPECT_LT(q8["tensors"][0]["nmse"].get<double>(), q4["tensors"][0]["nmse"].get<double>());
}

// --decoder tiny: each case's final latents (the reference's) through the tiny decoder too,
// its image the one `klein generate --decoder tiny` makes of the same generation, and its
// PSNR and SSIM against the full decoder's image; refused without a tiny decoder, with the
// wrong one, or with --no-e2e.
TEST_F(TinyReport, CliMeasuresTheTinyDecoderAgainstTheFullOne) {
  const fs::path out = *dir_ / "out-tiny";
  const fs::path taef2 = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2" / "taef2_decoder.pth";
  const std::string gen = " -p \"a red fox in fresh snow\" --seed 42 -W 64 -H 48 -s 2";
  std::string log;
  const std::string args = "report -m " + testing::tiny_model().string() + " --candidate " +
                           container("q8").string() + " -o " + out.string() + gen +
                           " --blocks none --decoder tiny --tiny-vae " + testing::shell_arg(taef2);
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr("Tiny decoder taef2_decoder.pth on the reference's final latents"));
  const json j = json::parse(read(out / "report.json"));
  const json& tiny = j["e2e"]["cases"][0]["tiny_decoder"];
  ASSERT_TRUE(tiny.is_object()) << j["e2e"]["cases"][0].dump();
  EXPECT_EQ(tiny["file"], "taef2_decoder.pth");
  const fs::path tiny_png = out / tiny["image"].get<std::string>();
  ASSERT_TRUE(fs::exists(tiny_png));
  // The tiny image is the one generate makes with the tiny decoder; the full one without.
  ASSERT_EQ(testing::run_klein("generate -m " + testing::tiny_model().string() + gen +
                                   " --no-cache -q --no-watermark --tiny-vae " + testing::shell_arg(taef2) +
                                   " --decoder tiny -o " + (out / "gen-tiny.png").string(),
                               &log),
            0)
      << log;
  const Image t = load_image(tiny_png), full = load_image(out / "case1-reference.png");
  EXPECT_EQ(t.rgb, load_image(out / "gen-tiny.png").rgb);
  // The 8-bit images' PSNR, near the report's (of the values before rounding).
  double se = 0;
  for (size_t i = 0; i < t.rgb.size(); ++i) {
    const double d = (double(t.rgb[i]) - double(full.rgb[i])) / 255.0;
    se += d * d;
  }
  const double psnr8 = 10 * std::log10(1.0 / (se / double(t.rgb.size())));
  EXPECT_NEAR(tiny["psnr_db"].get<double>(), psnr8, 0.3);
  EXPECT_GT(tiny["ssim"].get<double>(), -1.0);
  EXPECT_LT(tiny["ssim"].get<double>(), 1.0);

  const std::string base = "report -m " + testing::tiny_model().string() + " --candidate " +
                           container("q8").string() + gen + " --blocks none";
  EXPECT_NE(testing::run_klein(base + " --decoder tiny", &log), 0);
  EXPECT_THAT(log, HasSubstr("--decoder tiny needs the tiny decoder"));
  EXPECT_NE(testing::run_klein(base + " --tiny-vae " + testing::shell_arg(taef2.parent_path() /
                                                                          "taef1_random_decoder.safetensors"),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("need one of 32 latent channels"));
  EXPECT_THAT(log, Not(HasSubstr("compare tensors")));
  EXPECT_NE(testing::run_klein(base + " --no-e2e --tiny-vae " + testing::shell_arg(taef2), &log), 0);
  EXPECT_THAT(log, HasSubstr("not with --no-e2e"));
}

TEST_F(TinyReport, CliPolicyIsVerifiedAndConvertAcceptsIt) {
  const fs::path out = *dir_ / "out-policy";
  std::string log;
  const std::string args = "report -m " + testing::tiny_model().string() + " --candidate " +
                           container("q4").string() + " -o " + out.string() +
                           " -p \"a red fox in fresh snow\" --seed 42 --target-psnr 36 "
                           "--verify-rounds 1";
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr("Policy proposal"));
  const json j = json::parse(read(out / "report.json"));
  ASSERT_TRUE(j.contains("policy"));
  EXPECT_TRUE(j["policy"]["verified"].get<bool>());
  EXPECT_TRUE(j["policy"]["measured_psnr_db"].is_number());
  ASSERT_TRUE(fs::exists(out / "policy.txt"));
  ASSERT_TRUE(testing::convert_tiny(*dir_ / "from-policy.klein",
                                    "-t q4 --policy " + testing::shell_arg(out / "policy.txt"),
                                    &log));
  // The measured size is that of this conversion, but for the recorded policy text (the
  // file's comments now carry the measurement).
  EXPECT_NEAR(double(fs::file_size(*dir_ / "from-policy.klein")),
              j["policy"]["measured_file_bytes"].get<double>(), 16384);
  const container::ContainerFile f(*dir_ / "from-policy.klein");
  std::map<std::string, std::string> stored;
  for (const auto& t : f.index().tensors)
    stored[t.name] = convert::storage_type_name(t.type);
  for (const auto& t : j["policy"]["tensors"])
    EXPECT_EQ(stored.at(t["name"].get<std::string>()), t["type"].get<std::string>());
}

// The contents of a directory: file name -> bytes.
std::map<std::string, std::string> directory_contents(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out[e.path().filename().string()] = read_text_file(e.path());
  return out;
}

// A report that cannot be written whole (here its last file: a directory stands where its
// temporary file goes, as a full disk would stop it) leaves the earlier report as it was, not
// a mix; a report without the files of an earlier one (its policy) removes them.
TEST_F(TinyReport, AFailedWriteLeavesTheEarlierReport) {
  auto reference = open_model(testing::tiny_model());
  auto candidate = open_model(container("q8"));
  Compute cx(2);
  Report first;
  first.weights = compare_weights(*reference, *candidate, cx);
  Report second = first;
  second.policy = PolicyProposal{};
  second.policy->text = "transformer.* q8\n";
  const fs::path dir = *dir_ / "out-staged";
  write_report(first, dir);
  const auto before = directory_contents(dir);
  ASSERT_EQ(before.size(), 4u);
  const fs::path blocker = dir / ("policy.txt.tmp-" + std::to_string(::getpid()));
  fs::create_directories(blocker);
  EXPECT_THROW(write_report(second, dir), Error);
  EXPECT_EQ(directory_contents(dir), before);
  fs::remove(blocker);
  write_report(second, dir);
  auto after = directory_contents(dir);
  EXPECT_EQ(after.count("policy.txt"), 1u);
  EXPECT_NE(after["report.json"], before.at("report.json"));
  write_report(first, dir);
  EXPECT_EQ(directory_contents(dir), before);
}

TEST_F(TinyReport, CliErrorsNameTheInputAndWriteNothing) {
  const fs::path out = *dir_ / "out-error";
  std::string log;
  const std::string tiny = testing::tiny_model().string();
  EXPECT_NE(testing::run_klein("report -q -m " + tiny + " --candidate /no/such.klein -o " +
                                   out.string(),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("/no/such.klein"));
  EXPECT_NE(testing::run_klein("report -q -m " + tiny + " --candidate " + tiny + " -o " +
                                   out.string(),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("not a klein container"));
  EXPECT_NE(testing::run_klein("report -q -m " + container("q4").string() + " --candidate " +
                                   container("q8").string() + " --no-e2e -o " + out.string(),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("reference tensor"));
  EXPECT_NE(testing::run_klein("report -q -m " + tiny + " --candidate " +
                                   container("q4").string() + " --max-size lots",
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("--max-size lots"));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace klein
