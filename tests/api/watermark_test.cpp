// The C library marks what it makes as `klein generate` does: a 256x256 image (the smallest the
// dwtDct method marks) carries FLUX's message unless params.no_watermark is set, and the
// metadata (klein_image's and the saved file's) says which.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "formats/image/image.h"
#include "formats/image/watermark.h"
#include "klein/klein.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// One image of the tiny model, 256x256, one step, seed 2.
klein_image* generate(klein_session* session, bool no_watermark) {
  klein_generate_params p;
  klein_generate_params_init(&p);
  p.prompt = "a fox";
  p.seed = 2;
  p.has_seed = 1;
  p.width = p.height = 256;
  p.steps = 1;
  p.no_watermark = no_watermark ? 1 : 0;
  klein_image* image = nullptr;
  EXPECT_EQ(klein_generate(session, &p, &image), KLEIN_OK) << klein_session_error(session);
  return image;
}

Image pixels(const klein_image* image) {
  Image out;
  out.width = image->width;
  out.height = image->height;
  out.rgb.assign(image->pixels, image->pixels + size_t(image->width) * image->height * 3);
  return out;
}

TEST(CApiWatermark, MarkedByDefaultAndNotWithNoWatermark) {
  const fs::path out = testing::temp_dir("capi-watermark");
  klein_model* model = nullptr;
  klein_session* session = nullptr;
  char* error = nullptr;
  ASSERT_EQ(klein_model_open(testing::tiny_model().c_str(), nullptr, &model, &error), KLEIN_OK)
      << (error ? error : "");
  klein_session_options o;
  klein_session_options_init(&o);
  o.threads = 2;
  ASSERT_EQ(klein_session_new(model, &o, &session, &error), KLEIN_OK) << (error ? error : "");

  klein_image* marked = generate(session, false);
  klein_image* plain = generate(session, true);
  ASSERT_NE(marked, nullptr);
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(marked->width, 256);
  ASSERT_EQ(plain->height, 256);

  const std::string mark = testing::official_watermark_bits();
  const Image m = pixels(marked);
  Image p = pixels(plain);
  EXPECT_EQ(bits_text(read_watermark(m, mark.size()).bits), mark);
  EXPECT_NE(bits_text(read_watermark(p, mark.size()).bits), mark);
  EXPECT_EQ(json::parse(marked->metadata)["watermark"]["embedded"], true) << marked->metadata;
  EXPECT_EQ(json::parse(marked->metadata)["watermark"]["bits"], mark);
  EXPECT_EQ(json::parse(plain->metadata)["watermark"]["embedded"], false) << plain->metadata;
  EXPECT_EQ(json::parse(plain->metadata)["watermark"]["note"], "turned off");
  // Off leaves the pipeline's pixels: marking them gives the default image exactly.
  embed_watermark(p, flux_watermark_bits());
  EXPECT_EQ(p.rgb, m.rgb);

  // The saved file says the same, and holds the pixels it was given.
  ASSERT_EQ(klein_image_save(plain, (out / "plain.png").c_str(), &error), KLEIN_OK) << error;
  bool said = false;
  for (const auto& [key, value] : read_image_metadata(out / "plain.png"))
    if (key == "klein") said = json::parse(value)["watermark"]["embedded"] == false;
  EXPECT_TRUE(said);
  EXPECT_EQ(0, std::memcmp(load_image(out / "plain.png").rgb.data(), plain->pixels,
                           size_t(256 * 256 * 3)));

  klein_image_free(marked);
  klein_image_free(plain);
  klein_session_free(session);
  klein_model_free(model);
}

}  // namespace
}  // namespace klein
