// `klein generate --safety` (issue 66): the safety classifier (safety-tiny, whose classifier
// bias puts images on either side of a threshold) on the inputs before any work and on the
// generated image after decoding. The thresholds are placed around the image's own nsfw
// probability, as `klein safety` gives it for the image generated without --safety, so that
// one run is flagged and the other is not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "formats/image/blur.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kError = 1, kFlagged = 2;  // cli/main.cpp, cli/generate.cpp

using testing::safety_dir;
std::string safety_model() { return testing::shell_arg(safety_dir() / "model"); }
fs::path case_input(const std::string& name) {
  const fs::path dir = safety_dir() / "cases" / name;
  return dir / json::parse(read_text_file(dir / "case.json"))["input_file"].get<std::string>();
}

// `klein generate` of the tiny model at 32x32, one step, seed 2, with `extra` options.
int generate(const fs::path& out, const std::string& extra, std::string* log) {
  return testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                " -p 'a fox' -W 32 -H 32 -s 1 --seed 2 --no-cache -q " + extra +
                                " -o " + testing::shell_arg(out),
                            log);
}

json metadata(const fs::path& image) {
  for (const auto& [k, v] : read_image_metadata(image))
    if (k == "klein") return json::parse(v);
  return {};
}
std::string parameters(const fs::path& image) {
  for (const auto& [k, v] : read_image_metadata(image))
    if (k == "parameters") return v;
  return {};
}

// The JSON line of --json output whose "event" is `event` (null when there is none).
json event(const std::string& out, const std::string& name) {
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == name) return j;
  }
  return nullptr;
}

std::string fixed(double p) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4f", p);
  return text;
}

// The image made without --safety, and its nsfw probability by `klein safety`.
struct Plain {
  fs::path dir, image;
  double nsfw = -1;
};
const Plain& plain() {
  static const Plain p = [] {
    Plain p;
    p.dir = testing::temp_dir("safety-generate");
    p.image = p.dir / "plain.png";
    std::string log;
    EXPECT_EQ(generate(p.image, "", &log), 0) << log;
    EXPECT_EQ(
        testing::run_klein(
            "safety --json --model " + safety_model() + " " + testing::shell_arg(p.image), &log),
        0)
        << log;
    const json v = json::parse(log, nullptr, false);
    if (v.is_object()) p.nsfw = v["nsfw"].get<double>();
    return p;
  }();
  return p;
}

// Just above the image's probability it passes (unchanged, with the verdict in the metadata
// and the JSON result); just below it is refused: exit 2, no file, the probability named.
TEST(SafetyGenerate, FlaggedStrictlyAboveTheThresholdAndRefused) {
  const Plain& p = plain();
  ASSERT_GT(p.nsfw, 0.06);
  ASSERT_LT(p.nsfw, 0.94);
  std::string log;

  const fs::path passed = p.dir / "passed.png";
  ASSERT_EQ(generate(passed,
                     "--json --safety-model " + safety_model() + " --safety-threshold " +
                         fixed(p.nsfw + 0.05),
                     &log),
            0)
      << log;
  EXPECT_EQ(load_image(passed).rgb, load_image(p.image).rgb);  // the check changes nothing
  const json m = metadata(passed)["safety"];
  ASSERT_TRUE(m.is_object()) << metadata(passed).dump();
  // The decoded tensor truncated (BFL) against the written pixels rounded: close.
  EXPECT_NEAR(m["nsfw"].get<double>(), p.nsfw, 0.03) << m.dump();
  EXPECT_EQ(m["flagged"], false);
  EXPECT_EQ(m["blurred"], false);
  EXPECT_NEAR(m["threshold"].get<double>(), p.nsfw + 0.05, 1e-4);
  EXPECT_EQ(m["action"], "refuse");
  EXPECT_NE(parameters(passed).find(", Safety: nsfw " + fixed(m["nsfw"].get<double>())),
            std::string::npos)
      << parameters(passed);
  const json result = event(log, "result");
  ASSERT_TRUE(result.is_object()) << log;
  EXPECT_EQ(result["safety"]["nsfw"], m["nsfw"]) << result.dump();
  EXPECT_EQ(result["safety"]["flagged"], false);

  // Strictly above: a threshold equal to the probability (the float's exact value) passes.
  const fs::path equal = p.dir / "equal.png";
  ASSERT_EQ(generate(equal,
                     "--safety-model " + safety_model() + " --safety-threshold " + m["nsfw"].dump(),
                     &log),
            0)
      << log;
  EXPECT_EQ(metadata(equal)["safety"]["nsfw"], m["nsfw"]);
  EXPECT_EQ(metadata(equal)["safety"]["flagged"], false);

  const fs::path refused = p.dir / "refused.png";
  const double below = p.nsfw - 0.05;
  EXPECT_EQ(generate(refused,
                     "--json --safety --safety-model " + safety_model() + " --safety-threshold " +
                         fixed(below),
                     &log),
            kFlagged)
      << log;
  EXPECT_FALSE(fs::exists(refused));
  EXPECT_NE(log.find("nsfw probability of " + fixed(m["nsfw"].get<double>()) +
                     ", above the threshold " + fixed(below)),
            std::string::npos)
      << log;
  EXPECT_TRUE(event(log, "result").is_null()) << log;
  const json flagged = event(log, "safety");
  ASSERT_TRUE(flagged.is_object()) << log;
  EXPECT_EQ(flagged["image"], "output");
  EXPECT_EQ(flagged["flagged"], true);
  EXPECT_EQ(flagged["nsfw"], m["nsfw"]);
}

// --safety-action blur writes the image blurred (formats/image/blur.h on the pixels that
// would have been written: 32x32 images carry no mark), the metadata saying why.
TEST(SafetyGenerate, BlurWritesTheImageBlurredWithTheReason) {
  const Plain& p = plain();
  ASSERT_GT(p.nsfw, 0.06);
  std::string log;
  const fs::path blurred = p.dir / "blurred.png";
  ASSERT_EQ(generate(blurred,
                     "--safety-model " + safety_model() + " --safety-action blur " +
                         "--safety-threshold " + fixed(p.nsfw - 0.05),
                     &log),
            0)
      << log;
  const Image got = load_image(blurred);
  Image want = load_image(p.image);
  const Image original = want;
  box_blur(want, strong_blur_radius(want.width, want.height));
  EXPECT_EQ(got.rgb, want.rgb);
  // Strongly: the neighbouring pixels' differences (the detail) mostly gone.
  auto detail = [](const Image& im) {
    double sum = 0;
    for (int y = 0; y < im.height; ++y)
      for (int x = 1; x < im.width; ++x)
        for (int c = 0; c < 3; ++c) sum += std::abs(im.pixel(x, y)[c] - im.pixel(x - 1, y)[c]);
    return sum;
  };
  EXPECT_LT(detail(got), detail(original) / 5) << detail(got) << " vs " << detail(original);
  const json m = metadata(blurred)["safety"];
  EXPECT_EQ(m["flagged"], true) << m.dump();
  EXPECT_EQ(m["blurred"], true);
  EXPECT_EQ(m["action"], "blur");
  EXPECT_NE(m["note"].get<std::string>().find("blurred"), std::string::npos) << m.dump();
  EXPECT_NE(parameters(blurred).find(", Safety: flagged, nsfw "), std::string::npos)
      << parameters(blurred);
  EXPECT_NE(log.find("it is blurred"), std::string::npos) << log;
}

// A flagged reference stops the run before any network of the model runs (no text encoder,
// no file), naming its probability; one that passes is recorded in the metadata.
TEST(SafetyGenerate, ReferencesAreCheckedBeforeAnyWork) {
  const fs::path dir = testing::temp_dir("safety-reference");
  std::string log;
  const fs::path out = dir / "out.png";
  // grey_224: nsfw 0.897625 by the official pipeline, above BFL's 0.85.
  EXPECT_EQ(generate(out,
                     "--json --safety-model " + safety_model() + " -r " +
                         testing::shell_arg(case_input("grey_224")),
                     &log),
            kFlagged)
      << log;
  EXPECT_FALSE(fs::exists(out));
  EXPECT_NE(log.find("input image " + case_input("grey_224").string() +
                     " has an nsfw probability of 0.8976, above the threshold 0.8500"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("\"event\":\"begin\",\"phase\":\"text encoder\""), std::string::npos) << log;
  EXPECT_EQ(event(log, "safety")["image"], "input.png") << log;

  // rgba_portrait: 0.462759, not flagged; the output may be either (blur keeps it written).
  ASSERT_EQ(generate(out,
                     "--safety-model " + safety_model() + " --safety-action blur -r " +
                         testing::shell_arg(case_input("rgba_portrait")),
                     &log),
            0)
      << log;
  const json m = metadata(out)["safety"];
  ASSERT_EQ(m["inputs"].size(), 1u) << m.dump();
  EXPECT_NEAR(m["inputs"][0]["nsfw"].get<double>(), 0.462759, 1e-4);
  EXPECT_EQ(m["inputs"][0]["flagged"], false);
}

// Bad options fail before anything is loaded, naming the option.
TEST(SafetyGenerate, BadOptionsAreErrors) {
  const fs::path dir = testing::temp_dir("safety-options");
  const fs::path out = dir / "out.png";
  ::unsetenv("KLEIN_SAFETY_MODEL");  // --safety alone would take the classifier from there
  struct Case {
    std::string extra, message;
  };
  const Case cases[] = {
      {"--safety-model " + safety_model() + " --safety-threshold 1.5",
       "--safety-threshold 1.5 is outside [0, 1]"},
      {"--safety-model " + safety_model() + " --safety-threshold -0.1",
       "--safety-threshold -0.1 is outside [0, 1]"},
      {"--safety-model " + safety_model() + " --safety-action hide",
       "--safety-action: expected refuse"},
      {"--safety-threshold 0.5", "--safety-threshold and --safety-action need --safety"},
      {"--safety-model " + testing::shell_arg(dir / "missing"), "missing: not a directory"},
      {"--safety-model " + testing::shell_arg(testing::tiny_model()), "config.json"},
      {"--safety", "no classifier given"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.extra);
    std::string log;
    EXPECT_EQ(testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                     " -p x -W 32 -H 32 -s 1 -q --no-cache " + c.extra + " -o " +
                                     testing::shell_arg(out),
                                 &log),
              kError)
        << log;
    EXPECT_NE(log.find(c.message), std::string::npos) << log;
    EXPECT_FALSE(fs::exists(out));
  }
}

}  // namespace
}  // namespace klein
