// `klein serve --safety-model` (issue 66): every request's images go through the safety
// classifier (safety-tiny); a flagged one is answered with 422 naming its probability, or
// blurred with --safety-action blur; no request field turns the check off; /health says
// whether it is on and its threshold.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "core/files.h"
#include "formats/image/image.h"
#include "server/serve_process.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string safety_model() {
  return testing::shell_arg(testing::tiny_dir().parent_path() / "safety-tiny" / "model");
}

json health(httplib::Client& c) {
  auto r = c.Get("/health");
  EXPECT_TRUE(r);
  return r ? json::parse(r->body, nullptr, false) : json();
}

json safety_metadata(const fs::path& png) {
  for (const auto& [k, v] : read_image_metadata(png))
    if (k == "klein") return json::parse(v)["safety"];
  return {};
}

const json kRequest = {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}, {"seed", 2}};

// Threshold 0: every image with a probability above 0 is flagged. Both APIs answer 422 with
// the probability, a request cannot turn the check off, and /health says it is on.
TEST(ServeSafety, FlaggedImagesAreRefusedWith422) {
  ServeProcess serve("--safety-model " + safety_model() + " --safety-threshold 0");
  httplib::Client c = serve.client();
  const json h = health(c);
  EXPECT_EQ(h["safety"]["enabled"], true) << h.dump();
  EXPECT_EQ(h["safety"]["threshold"], 0.0);
  EXPECT_EQ(h["safety"]["action"], "refuse");

  json off = kRequest;
  off["safety"] = false;  // no such field: the server's check stays on
  const json openai = post_json(c, "/v1/images/generations", off, 422);
  const std::string message = openai["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("the generated image has an nsfw probability of 0."), std::string::npos)
      << message;
  EXPECT_NE(message.find("above the threshold 0.0000"), std::string::npos) << message;
  EXPECT_EQ(openai["error"]["type"], "content_policy_violation");
  EXPECT_EQ(openai["error"]["code"], 422);

  const json a1111 = post_json(
      c, "/sdapi/v1/txt2img",
      {{"prompt", kPrompt}, {"width", 32}, {"height", 32}, {"steps", 1}, {"seed", 2}}, 422);
  EXPECT_EQ(a1111["error"], "Unprocessable Entity") << a1111.dump();
  EXPECT_NE(a1111["detail"].get<std::string>().find("nsfw probability"), std::string::npos);
}

// Blur: the image is answered, blurred, with the verdict in its metadata; threshold 1
// flags nothing.
TEST(ServeSafety, BlurAnswersTheImageAndItsVerdict) {
  const fs::path out = testing::temp_dir("serve-safety");
  {
    ServeProcess serve("--safety-model " + safety_model() +
                       " --safety-threshold 0 --safety-action blur");
    httplib::Client c = serve.client();
    EXPECT_EQ(health(c)["safety"]["action"], "blur");
    const json reply = post_json(c, "/v1/images/generations", kRequest);
    ASSERT_EQ(reply["data"].size(), 1u) << reply.dump();
    reply_png(reply["data"][0]["b64_json"], out / "blurred.png");
    const json m = safety_metadata(out / "blurred.png");
    EXPECT_EQ(m["flagged"], true) << m.dump();
    EXPECT_EQ(m["blurred"], true);
  }
  {
    ServeProcess serve("--safety-model " + safety_model() + " --safety-threshold 1");
    httplib::Client c = serve.client();
    const json reply = post_json(c, "/v1/images/generations", kRequest);
    ASSERT_EQ(reply["data"].size(), 1u) << reply.dump();
    reply_png(reply["data"][0]["b64_json"], out / "passed.png");
    const json m = safety_metadata(out / "passed.png");
    EXPECT_EQ(m["flagged"], false) << m.dump();
    EXPECT_GT(m["nsfw"].get<double>(), 0.0);
  }
}

// Without a classifier (or with --no-safety) the checks are off and /health says so; a bad
// threshold or classifier stops the server before it listens.
TEST(ServeSafety, OffWithoutAClassifierAndBadOptionsAreErrors) {
  ::unsetenv("KLEIN_SAFETY_MODEL");
  {
    ServeProcess serve("--no-safety");
    httplib::Client c = serve.client();
    EXPECT_EQ(health(c)["safety"], json({{"enabled", false}}));
  }
  std::string log;
  const std::string serve = "serve -m " + testing::shell_arg(testing::tiny_model()) + " --port 0 ";
  EXPECT_EQ(testing::run_klein(serve + "--safety-model " + safety_model() + " --safety-threshold 2",
                               &log),
            1);
  EXPECT_NE(log.find("--safety-threshold 2 is outside [0, 1]"), std::string::npos) << log;
  EXPECT_EQ(log.find("listening"), std::string::npos) << log;
  EXPECT_EQ(testing::run_klein(
                serve + "--safety-model " + testing::shell_arg(testing::tiny_model()), &log),
            1);
  EXPECT_NE(log.find("config.json"), std::string::npos) << log;
  EXPECT_EQ(testing::run_klein(serve + "--no-safety --safety-model " + safety_model(), &log), 1);
  EXPECT_NE(log.find("--no-safety with --safety-model"), std::string::npos) << log;
}

}  // namespace
}  // namespace klein
