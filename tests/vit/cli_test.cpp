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

// `klein safety -m FILE`'s verdicts, one JSON object per line.
std::vector<json> verdicts(const std::string& model, const std::vector<std::string>& names,
                           int status) {
  std::string args = "safety --json -t 2 --model " + model;
  for (const std::string& n : names) args += " " + testing::shell_arg(input_of(n));
  std::string out;
  EXPECT_EQ(testing::run_klein(args, &out), status) << out;
  std::vector<json> all;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') all.push_back(json::parse(line, nullptr, false));
  EXPECT_EQ(all.size(), names.size()) << out;
  return all;
}

// `convert --safety-model DIR` stores the classifier beside the model: at -t keep its verdicts
// are the directory's (the official pipeline's), at q8 within the quantization's reach with
// the same verdicts; inspect says so; `generate --safety` and a conversion of the container
// find it without being told; a directory that is no classifier is refused before anything is
// written.
TEST(SafetyCli, AContainerCarriesTheClassifier) {
  const fs::path out = testing::temp_dir("safety-container");
  const std::vector<std::string> names = {"rgb_landscape", "jpeg_exif6", "grey_224"};
  const std::string classifier = " --safety-model " + testing::shell_arg(safety_dir() / "model");
  ASSERT_TRUE(testing::convert_tiny(out / "keep.klein", "-t keep" + classifier));
  ASSERT_TRUE(testing::convert_tiny(out / "q8.klein", "-t q8" + classifier));
  const std::vector<json> kept = verdicts(testing::shell_arg(out / "keep.klein"), names, kFlagged);
  const std::vector<json> q8 = verdicts(testing::shell_arg(out / "q8.klein"), names, kFlagged);
  for (size_t i = 0; i < names.size() && i < kept.size() && i < q8.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const json want = json::parse(read_text_file(safety_dir() / "cases" / names[i] / "case.json"));
    EXPECT_NEAR(kept[i]["nsfw"].get<double>(), want["nsfw_score"].get<double>(), 1e-5);
    // Q8 matrices and bf16 embeddings (the policy): 0.020-0.021 from the official
    // probability on this 32-wide random network.
    EXPECT_NEAR(q8[i]["nsfw"].get<double>(), want["nsfw_score"].get<double>(), 3e-2);
    EXPECT_EQ(kept[i]["flagged"], want["flagged"]);
    EXPECT_EQ(q8[i]["flagged"], want["flagged"]);
  }
  std::string log;
  ASSERT_EQ(testing::run_klein("inspect -m " + testing::shell_arg(out / "q8.klein"), &log), 0);
  EXPECT_NE(log.find("safety classifier: yes (model: ViT, 2 layers, hidden 32"), std::string::npos)
      << log;

  // generate --safety: the container's classifier, its verdict in the result. A fixed seed:
  // this random classifier gives the tiny model's images 0.41 (seed 4) to 0.91 (a seed a
  // clean-clone CI drew), so a random seed was flagged now and then.
  ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(out / "keep.klein") +
                                   " -p fox -W 64 -H 64 -s 1 --seed 4 --safety --no-cache --json -o " +
                                   testing::shell_arg(out / "fox.png"),
                               &log),
            0)
      << log;
  EXPECT_NE(log.find("\"safety\""), std::string::npos) << log;
  // A conversion of the container carries it over.
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(out / "q8.klein") + " -t q8 -q -o " +
                                   testing::shell_arg(out / "again.klein"),
                               &log),
            0)
      << log;
  const std::vector<json> again = verdicts(testing::shell_arg(out / "again.klein"), {"grey_224"}, kFlagged);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["nsfw"], q8[2]["nsfw"]);
  // A model container without one: named as such.
  ASSERT_TRUE(testing::convert_tiny(out / "plain.klein", "-t q8"));
  EXPECT_EQ(testing::run_klein("safety --model " + testing::shell_arg(out / "plain.klein") + " " +
                                   testing::shell_arg(input_of("grey_224")),
                               &log),
            kError);
  EXPECT_NE(log.find("holds no safety classifier"), std::string::npos) << log;
  // A directory that is not a classifier: refused by name, no output.
  EXPECT_NE(testing::run_klein("convert -m " + testing::shell_arg(testing::tiny_model()) +
                                   " -t q8 --safety-model " + testing::shell_arg(testing::tiny_model()) +
                                   " -o " + testing::shell_arg(out / "no.klein"),
                               &log),
            0);
  EXPECT_NE(log.find("config.json"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(out / "no.klein"));
}

}  // namespace
}  // namespace klein
