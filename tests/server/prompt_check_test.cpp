// `klein serve --check-prompt` (issue 66): every request's prompt is checked by the model's text
// encoder as `klein check-prompt` checks it (pipeline/prompt_check.h; the verdicts themselves
// are tested against transformers in tests/pipeline); a flagged one is answered with 422 by
// both APIs, a passed one is generated; /health says whether the check is on;
// a model that cannot check is refused at start.
#include <gtest/gtest.h>
#include <httplib.h>

#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <thread>
#include <string>

#include <nlohmann/json.hpp>

#include "server/serve_process.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The tiny klein-9B answers "yes" to the first and "no" to the second, as transformers does
// (tests/data/prompt-check); checked below through `klein check-prompt`.
fs::path nine_b() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "klein-tiny-9b" / "model"; }
const char* const kFlaggedPrompt = "Mickey Mouse eating ice cream";
const char* const kPassedPrompt = "a bowl of fruit";

TEST(ServePromptCheck, FlaggedPromptsGet422AndPassedOnesAreGenerated) {
  std::string out;
  ASSERT_EQ(testing::run_klein("check-prompt --no-cache --threads 2 -m " + testing::shell_arg(nine_b()) +
                                   " -p " + testing::shell_arg(kFlaggedPrompt) + " -p " +
                                   testing::shell_arg(kPassedPrompt), &out), 2) << out;
  ASSERT_NE(out.find(std::string("FLAGGED: ") + kFlaggedPrompt), std::string::npos) << out;
  ASSERT_NE(out.find(std::string("passed: ") + kPassedPrompt), std::string::npos) << out;

  ServeProcess serve("--check-prompt", nine_b());
  httplib::Client c = serve.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(json::parse(h->body)["prompt_check"]["enabled"], true) << h->body;

  const json flagged = {{"prompt", kFlaggedPrompt}, {"size", "32x32"}, {"steps", 1}, {"seed", 2}};
  const json openai = post_json(c, "/v1/images/generations", flagged, 422);
  const std::string message = openai["error"]["message"].get<std::string>();
  EXPECT_NE(message.find("the prompt was flagged by the server's prompt check for potential "
                         "copyright or public personas concerns"), std::string::npos) << message;
  EXPECT_EQ(openai["error"]["type"], "content_policy_violation");
  const json a1111 = post_json(
      c, "/sdapi/v1/txt2img",
      {{"prompt", kFlaggedPrompt}, {"width", 32}, {"height", 32}, {"steps", 1}, {"seed", 2}}, 422);
  EXPECT_NE(a1111["detail"].get<std::string>().find("flagged by the server's prompt check"),
            std::string::npos) << a1111.dump();

  json passed = flagged;
  passed["prompt"] = kPassedPrompt;
  const json ok = post_json(c, "/v1/images/generations", passed, 200);
  ASSERT_TRUE(ok.contains("data")) << ok.dump();
  EXPECT_EQ(ok["data"].size(), 1u);
}

TEST(ServePromptCheck, AModelThatCannotCheckIsRefusedAtStart) {
  const fs::path dir = testing::temp_dir("serve_prompt_check");
  const fs::path container = dir / "tiny.klein";
  ASSERT_TRUE(testing::convert_tiny(container, "-t bf16"));  // no language-model head kept
  // The server binds, opens the model, refuses it and exits with 1 by itself.
  ServeProcess serve("--check-prompt", container, /*wait_ready=*/false);
  int status = -1;
  for (int i = 0; i < 600 && status < 0; ++i) {
    int raw = 0;
    if (::waitpid(serve.pid(), &raw, WNOHANG) == serve.pid())
      status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128;
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(status, 1) << "klein serve --check-prompt did not stop on a model without its head";
  if (status < 0) serve.stop();
  else serve.forget();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace klein
