// The C library's prompt check (params.check_prompt, issue 66): a flagged prompt is
// KLEIN_ERROR_FLAGGED before any work (no progress phase of a generation, no image), a passed
// one is generated, and a model without its language-model head is an error naming the
// parameter. The verdicts are those of `klein check-prompt` (tests/pipeline: against
// transformers).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "klein/klein.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

// The tiny klein-9B answers "yes" to the first and "no" to the second, as transformers does
// (tests/data/prompt-check); checked below.
const char* const kFlaggedPrompt = "Mickey Mouse eating ice cream";
const char* const kPassedPrompt = "a bowl of fruit";

struct Session {
  klein_model* model = nullptr;
  klein_session* session = nullptr;
  explicit Session(const fs::path& path) {
    char* error = nullptr;
    EXPECT_EQ(klein_model_open(path.c_str(), nullptr, &model, &error), KLEIN_OK)
        << (error ? error : "");
    klein_session_options o;
    klein_session_options_init(&o);
    o.threads = 2;
    EXPECT_EQ(klein_session_new(model, &o, &session, &error), KLEIN_OK) << (error ? error : "");
  }
  ~Session() {
    klein_session_free(session);
    klein_model_free(model);
  }
};

int record_phase(const klein_progress* p, void* user) {
  static_cast<std::vector<std::string>*>(user)->push_back(p->phase);
  return 0;
}

TEST(CApiPromptCheck, AFlaggedPromptStopsBeforeAnyWork) {
  const fs::path nine_b = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "klein-tiny-9b" / "model";
  std::string out;
  ASSERT_EQ(testing::run_klein("check-prompt --no-cache --threads 2 -m " + testing::shell_arg(nine_b) +
                                   " -p " + testing::shell_arg(kFlaggedPrompt) + " -p " +
                                   testing::shell_arg(kPassedPrompt), &out), 2) << out;
  ASSERT_NE(out.find(std::string("FLAGGED: ") + kFlaggedPrompt), std::string::npos) << out;
  ASSERT_NE(out.find(std::string("passed: ") + kPassedPrompt), std::string::npos) << out;

  Session s(nine_b);
  klein_generate_params p;
  klein_generate_params_init(&p);
  EXPECT_EQ(p.check_prompt, 0);
  p.seed = 2;
  p.has_seed = 1;
  p.width = p.height = 32;
  p.steps = 1;
  p.check_prompt = 1;
  std::vector<std::string> phases;
  p.progress = record_phase;
  p.user_data = &phases;

  p.prompt = kFlaggedPrompt;
  klein_image* image = nullptr;
  EXPECT_EQ(klein_generate(s.session, &p, &image), KLEIN_ERROR_FLAGGED);
  EXPECT_EQ(image, nullptr);
  const std::string message = klein_session_error(s.session);
  EXPECT_NE(message.find("flagged by params.check_prompt for potential copyright or public "
                         "personas concerns"), std::string::npos) << message;
  EXPECT_TRUE(phases.empty()) << phases.front();  // no phase of the generation began
  klein_image* batch[2] = {nullptr, nullptr};
  EXPECT_EQ(klein_generate_batch(s.session, &p, 2, batch), KLEIN_ERROR_FLAGGED);
  EXPECT_EQ(batch[0], nullptr);

  p.prompt = kPassedPrompt;
  ASSERT_EQ(klein_generate(s.session, &p, &image), KLEIN_OK) << klein_session_error(s.session);
  EXPECT_EQ(image->width, 32);
  klein_image_free(image);
  EXPECT_FALSE(phases.empty());
}

TEST(CApiPromptCheck, AModelWithoutItsHeadIsAnError) {
  const fs::path dir = testing::temp_dir("capi_prompt_check");
  const fs::path container = dir / "tiny.klein";
  ASSERT_TRUE(testing::convert_tiny(container, "-t bf16"));
  {
    Session s(container);
    klein_generate_params p;
    klein_generate_params_init(&p);
    p.prompt = "a fox";
    p.width = p.height = 32;
    p.steps = 1;
    p.check_prompt = 1;
    klein_image* image = nullptr;
    EXPECT_EQ(klein_generate(s.session, &p, &image), KLEIN_ERROR);
    EXPECT_EQ(image, nullptr);
    const std::string message = klein_session_error(s.session);
    EXPECT_NE(message.find("params.check_prompt: this model cannot check prompts"),
              std::string::npos) << message;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace klein
