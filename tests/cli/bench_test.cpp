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

}  // namespace
}  // namespace klein
