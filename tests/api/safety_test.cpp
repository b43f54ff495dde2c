// The C library's safety check (params.safety_model, issue 66): a flagged image is
// KLEIN_ERROR_FLAGGED with the probability in the message and no image, or blurred with
// KLEIN_SAFETY_BLUR; the verdict is in the metadata; bad values are errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "klein/klein.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(CApiSafety, FlaggedRefusedOrBlurredAndRecorded) {
  const std::string classifier =
      (testing::tiny_dir().parent_path() / "safety-tiny" / "model").string();
  klein_model* model = nullptr;
  klein_session* session = nullptr;
  char* error = nullptr;
  ASSERT_EQ(klein_model_open(testing::tiny_model().c_str(), nullptr, &model, &error), KLEIN_OK)
      << (error ? error : "");
  klein_session_options o;
  klein_session_options_init(&o);
  o.threads = 2;
  ASSERT_EQ(klein_session_new(model, &o, &session, &error), KLEIN_OK) << (error ? error : "");

  klein_generate_params p;
  klein_generate_params_init(&p);
  EXPECT_EQ(p.safety_model, nullptr);
  EXPECT_LT(p.safety_threshold, 0);
  EXPECT_EQ(p.safety_action, KLEIN_SAFETY_REFUSE);
  p.prompt = "a fox";
  p.seed = 2;
  p.has_seed = 1;
  p.width = p.height = 32;
  p.steps = 1;
  p.safety_model = classifier.c_str();

  // Threshold 1 flags nothing: the verdict is in the metadata.
  p.safety_threshold = 1;
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(session, &p, &image), KLEIN_OK) << klein_session_error(session);
  const json passed = json::parse(image->metadata)["safety"];
  klein_image_free(image);
  EXPECT_EQ(passed["flagged"], false) << passed.dump();
  EXPECT_EQ(passed["threshold"], 1.0);
  const double nsfw = passed["nsfw"].get<double>();
  ASSERT_GT(nsfw, 0.0);

  // Threshold 0 flags it: no image, the probability named.
  p.safety_threshold = 0;
  image = nullptr;
  EXPECT_EQ(klein_generate(session, &p, &image), KLEIN_ERROR_FLAGGED);
  EXPECT_EQ(image, nullptr);
  const std::string message = klein_session_error(session);
  EXPECT_NE(message.find("nsfw probability of"), std::string::npos) << message;
  EXPECT_NE(message.find("above the threshold 0.0000"), std::string::npos) << message;
  klein_image* batch[2] = {nullptr, nullptr};
  EXPECT_EQ(klein_generate_batch(session, &p, 2, batch), KLEIN_ERROR_FLAGGED);
  EXPECT_EQ(batch[0], nullptr);

  // Blur: the image, blurred, and why.
  p.safety_action = KLEIN_SAFETY_BLUR;
  ASSERT_EQ(klein_generate(session, &p, &image), KLEIN_OK) << klein_session_error(session);
  const json blurred = json::parse(image->metadata)["safety"];
  EXPECT_NE(std::string(image->parameters).find("Safety: flagged"), std::string::npos);
  klein_image_free(image);
  EXPECT_EQ(blurred["blurred"], true) << blurred.dump();
  EXPECT_EQ(blurred["nsfw"].get<double>(), nsfw);

  // Bad values.
  p.safety_threshold = 1.5f;
  EXPECT_EQ(klein_generate(session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(session)).find("params.safety_threshold"),
            std::string::npos)
      << klein_session_error(session);
  p.safety_threshold = 0.5f;
  p.safety_model = nullptr;
  EXPECT_EQ(klein_generate(session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(session)).find("need params.safety_model"),
            std::string::npos)
      << klein_session_error(session);
  p.safety_model = "/nonexistent-classifier";
  EXPECT_EQ(klein_generate(session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(session)).find("nonexistent-classifier"),
            std::string::npos);

  klein_session_free(session);
  klein_model_free(model);
}

}  // namespace
}  // namespace klein
