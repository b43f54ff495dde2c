// `klein serve` marks what it makes as `klein generate` does: a 256x256 image (the smallest the
// dwtDct method marks) carries FLUX's message unless the request says "watermark": false, and
// the PNG's metadata says which.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "core/files.h"
#include "formats/image/image.h"
#include "formats/image/watermark.h"
#include "server/serve_process.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json watermark_metadata(const fs::path& png) {
  for (const auto& [k, v] : read_image_metadata(png))
    if (k == "klein") return json::parse(v)["watermark"];
  return {};
}

TEST(ServeWatermark, MarkedByDefaultAndNotWhenTheRequestSaysFalse) {
  const fs::path out = testing::temp_dir("serve-watermark");
  ServeProcess serve;
  httplib::Client c = serve.client();
  const json request = {{"prompt", kPrompt}, {"size", "256x256"}, {"steps", 1}, {"seed", 2}};
  json marked_reply = post_json(c, "/v1/images/generations", request);
  json off = request;
  off["watermark"] = false;
  json plain_reply = post_json(c, "/v1/images/generations", off);
  ASSERT_EQ(marked_reply["data"].size(), 1u);
  ASSERT_EQ(plain_reply["data"].size(), 1u);
  const Image marked = reply_png(marked_reply["data"][0]["b64_json"], out / "marked.png");
  Image plain = reply_png(plain_reply["data"][0]["b64_json"], out / "plain.png");
  ASSERT_EQ(marked.width, 256);
  ASSERT_EQ(plain.height, 256);

  const std::string mark = testing::official_watermark_bits();
  EXPECT_EQ(bits_text(read_watermark(marked, mark.size()).bits), mark);
  EXPECT_NE(bits_text(read_watermark(plain, mark.size()).bits), mark);
  json m = watermark_metadata(out / "marked.png");
  EXPECT_EQ(m["embedded"], true) << m.dump();
  EXPECT_EQ(m["bits"], mark);
  json p = watermark_metadata(out / "plain.png");
  EXPECT_EQ(p["embedded"], false) << p.dump();
  EXPECT_EQ(p["note"], "turned off");

  // Off leaves the pipeline's pixels: marking them gives the default reply exactly.
  embed_watermark(plain, flux_watermark_bits());
  EXPECT_EQ(plain.rgb, marked.rgb);
  EXPECT_EQ(serve.stop(), 0);
}

}  // namespace
}  // namespace klein
