// "prompt": "" is a prompt (the empty one, as the official pipelines take it) on both APIs: the
// image `klein generate -p ""` makes; a request without a prompt stays refused where the API
// requires one (OpenAI), and the page lets its prompt field be left empty.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "formats/image/image.h"
#include "server/serve_process.h"
#include "support/cli_image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string klein_metadata(const fs::path& png) {
  for (const auto& [k, v] : read_image_metadata(png))
    if (k == "klein") return v;
  return "";
}

TEST(ServeEmptyPrompt, BothApisMakeTheCliImageOfTheEmptyPrompt) {
  const fs::path out = testing::temp_dir("serve-empty-prompt");
  const Image cli =
      testing::cli_generate(testing::tiny_model(), "", "--seed 4 -W 64 -H 48 -s 2", out / "cli.png");

  ServeProcess serve;
  httplib::Client c = serve.client();
  json openai = post_json(c, "/v1/images/generations",
                                {{"prompt", ""}, {"size", "64x48"}, {"steps", 2}, {"seed", 4}});
  ASSERT_EQ(openai["data"].size(), 1u) << openai.dump().substr(0, 500);
  EXPECT_EQ(openai["data"][0]["revised_prompt"], "");
  EXPECT_EQ(reply_png(openai["data"][0]["b64_json"], out / "openai.png").rgb, cli.rgb);
  EXPECT_EQ(json::parse(klein_metadata(out / "openai.png"))["prompt"], "");

  json a1111 = post_json(c, "/sdapi/v1/txt2img",
                               {{"prompt", ""}, {"width", 64}, {"height", 48}, {"steps", 2},
                                {"seed", 4}});
  ASSERT_EQ(a1111["images"].size(), 1u) << a1111.dump().substr(0, 500);
  EXPECT_EQ(reply_png(a1111["images"][0], out / "a1111.png").rgb, cli.rgb);
  EXPECT_EQ(json::parse(a1111["info"].get<std::string>())["prompt"], "");

  // OpenAI's API requires the key; "" is a value of it, absence is not.
  const json missing = post_json(c, "/v1/images/generations", {{"size", "64x48"}}, 400);
  EXPECT_NE(missing.dump().find("\\\"prompt\\\": required"), std::string::npos) << missing.dump();

  // The page's form does not insist on a prompt.
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  const size_t field = page->body.find("<textarea id=\"prompt\"");
  ASSERT_NE(field, std::string::npos);
  const std::string tag = page->body.substr(field, page->body.find('>', field) - field);
  EXPECT_EQ(tag.find("required"), std::string::npos) << tag;
  EXPECT_EQ(serve.stop(), 0);
}

}  // namespace
}  // namespace klein
