// klein bench matmul: the table and JSON name every requested type with a throughput, and bad
// options are refused with a message naming them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "support/testing.h"

namespace klein {
namespace {

using ::testing::HasSubstr;

TEST(BenchMatmulCli, JsonHasEveryTypeAndShapeWithSgemmAlongside) {
  std::string out;
  ASSERT_EQ(testing::run_klein("bench matmul --rows 768 -t q4 -t bf16 --min-seconds 0.01 --json",
                               &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  std::set<std::string> types;
  for (const auto& r : j["rows"]) {
    types.insert(r["type"].get<std::string>());
    EXPECT_EQ(r["M"].get<int>(), 768);
    EXPECT_GT(r["gops"].get<double>(), 0.0);
    EXPECT_GT(r["sgemm_gops"].get<double>(), 0.0);
  }
  EXPECT_EQ(types, (std::set<std::string>{"Q4", "BF16"}));
}

TEST(BenchMatmulCli, BadOptionsAreNamed) {
  std::string out;
  EXPECT_NE(testing::run_klein("bench matmul -t q3", &out), 0);
  EXPECT_THAT(out, HasSubstr("unknown weight type 'q3'"));
  EXPECT_NE(testing::run_klein("bench matmul --rows 5", &out), 0);
  EXPECT_THAT(out, HasSubstr("--rows"));
  EXPECT_NE(testing::run_klein("bench", &out), 0);
}

TEST(BenchPeakCli, JsonNamesTheInstructionAndARate) {
  std::string out;
  ASSERT_EQ(testing::run_klein("bench peak --threads 1 --seconds 0.02 --json", &out), 0) << out;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  ASSERT_EQ(j["peaks"].size(), 1u) << out;
  const auto& p = j["peaks"][0];
  EXPECT_EQ(p["threads"].get<int>(), 1);
  if (p["isa"] != "scalar") {
    EXPECT_FALSE(p["instruction"].get<std::string>().empty());
    EXPECT_GT(p["gmacs"].get<double>(), 1.0);  // any SIMD unit does a billion a second
  }
  EXPECT_NE(testing::run_klein("bench peak --seconds 0", &out), 0);
  EXPECT_THAT(out, HasSubstr("--seconds must be positive"));
}

// The tiny model's forwards on made-up inputs: timed, counted, and a fraction of the peak
// that is a fraction (a forward faster than the instruction's peak would mean a wrong count
// or a wrong peak).
TEST(BenchStepCli, TimesForwardsAndStatesTheFractionOfThePeak) {
  std::string out;
  ASSERT_EQ(testing::run_klein("bench step -m " + testing::tiny_model().string() +
                                   " -W 64 -H 48 --forwards 2 --threads 1 --json",
                               &out),
            0)
      << out;
  const auto j = nlohmann::json::parse(out.substr(out.find('{')));
  EXPECT_EQ(j["width"].get<int>(), 64);
  EXPECT_EQ(j["height"].get<int>(), 48);
  ASSERT_EQ(j["forward_seconds"].size(), 2u);
  for (const auto& t : j["forward_seconds"]) EXPECT_GT(t.get<double>(), 0.0);
  EXPECT_GT(j["linear_macs"].get<double>(), 0.0);
  EXPECT_GT(j["attention_macs"].get<double>(), 0.0);
  if (j["isa"] != "scalar") {
    EXPECT_GT(j["peak_fraction"].get<double>(), 0.0);
    EXPECT_LT(j["peak_fraction"].get<double>(), 1.0);
  }
  // One thread hands no loop to a pool; two do, the same number in every forward.
  EXPECT_EQ(j["forward_loops"], nlohmann::json::array({0, 0}));
  ASSERT_EQ(testing::run_klein("bench step -m " + testing::tiny_model().string() +
                                   " -W 64 -H 48 --forwards 2 --threads 2 --json",
                               &out),
            0)
      << out;
  const auto two = nlohmann::json::parse(out.substr(out.find('{')));
  ASSERT_EQ(two["forward_loops"].size(), 2u);
  EXPECT_GT(two["forward_loops"][0].get<int64_t>(), 10);
  EXPECT_EQ(two["forward_loops"][0], two["forward_loops"][1]);
  for (const auto& t : two["forward_wait_seconds"]) EXPECT_GE(t.get<double>(), 0.0);
  // The time each forward spent acquiring its units: part of the forward's.
  ASSERT_EQ(two["forward_acquire_seconds"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(two["forward_acquire_seconds"][i].get<double>(), 0.0);
    EXPECT_LT(two["forward_acquire_seconds"][i].get<double>(),
              two["forward_seconds"][i].get<double>());
  }
  EXPECT_NE(testing::run_klein("bench step -m " + testing::tiny_model().string() + " -W 50", &out),
            0);
  EXPECT_THAT(out, HasSubstr("multiple of 16"));
  EXPECT_THAT(out, HasSubstr("50x256"));
}

}  // namespace
}  // namespace klein
