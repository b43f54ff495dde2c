// `klein safety` on the tiny classifier of ../shared/testdata/safety-tiny: its verdicts are the
// official pipeline's, its exit status says whether anything was flagged, and bad input is an
// error of its own status.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "core/files.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kError = 1, kFlagged = 2;  // cli/safety.cpp

using testing::safety_dir;
std::string model_arg() { return "--model " + testing::shell_arg(safety_dir() / "model"); }
fs::path input_of(const std::string& name) {
  const fs::path dir = safety_dir() / "cases" / name;
  const json c = json::parse(read_text_file(dir / "case.json"));
  return dir / c["input_file"].get<std::string>();
}

TEST(SafetyCli, JsonVerdictsAreThePipelines) {
  // Two below the threshold and one above, in one call: flagged overall.
  const std::vector<std::string> names = {"rgb_landscape", "jpeg_exif6", "grey_224"};
  std::string args = "safety --json -t 2 " + model_arg();
  for (const std::string& n : names) args += " " + testing::shell_arg(input_of(n));
  std::string out;
  EXPECT_EQ(testing::run_klein(args, &out), kFlagged) << out;
  std::istringstream lines(out);
  std::string line;
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    ASSERT_TRUE(std::getline(lines, line)) << out;
    const json got = json::parse(line, nullptr, false);
    ASSERT_FALSE(got.is_discarded()) << line;
    const json want = json::parse(read_text_file(safety_dir() / "cases" / n / "case.json"));
    EXPECT_EQ(got["file"], input_of(n).string());
    EXPECT_NEAR(got["nsfw"].get<double>(), want["nsfw_score"].get<double>(), 1e-5);
    EXPECT_EQ(got["flagged"], want["flagged"]);
    EXPECT_EQ(got["label"], want["pipeline_scores"][0]["label"]);
    EXPECT_EQ(got["threshold"].get<double>(), 0.85);
    EXPECT_NEAR(got["scores"]["normal"].get<double>() + got["scores"]["nsfw"].get<double>(), 1.0,
                1e-6);
  }
}

TEST(SafetyCli, ExitStatusFollowsTheThreshold) {
  const std::string image = testing::shell_arg(input_of("grey_224"));  // nsfw 0.8976
  std::string out;
  EXPECT_EQ(testing::run_klein("safety " + model_arg() + " " + image, &out), kFlagged) << out;
  EXPECT_NE(out.find("nsfw, nsfw 0.897"), std::string::npos) << out;
  EXPECT_NE(out.find("FLAGGED"), std::string::npos) << out;
  EXPECT_EQ(testing::run_klein("safety --threshold 0.9 " + model_arg() + " " + image, &out), 0)
      << out;
  EXPECT_NE(out.find("not flagged (threshold 0.9)"), std::string::npos) << out;
}

TEST(SafetyCli, BadInputIsAnError) {
  const std::string image = testing::shell_arg(input_of("rgb_landscape"));
  std::string out;
  for (const char* t : {"1.5", "-0.1"}) {
    EXPECT_EQ(testing::run_klein(
                  "safety --threshold " + std::string(t) + " " + model_arg() + " " + image, &out),
              kError)
        << out;
    EXPECT_NE(out.find("--threshold " + std::string(t) + " is outside [0, 1]"), std::string::npos)
        << out;
  }
  EXPECT_EQ(testing::run_klein("safety " + model_arg() + " /nonexistent.png", &out), kError);
  EXPECT_NE(out.find("/nonexistent.png does not exist"), std::string::npos) << out;
  EXPECT_EQ(testing::run_klein("safety --model /nonexistent " + image, &out), kError);
  EXPECT_NE(out.find("/nonexistent does not exist"), std::string::npos) << out;
}

}  // namespace
}  // namespace klein
