// `klein generate` marks what it makes (the dwtDct mark, formats/image/watermark.h) unless told
// not to, records it in the metadata, and `klein watermark --check` reads it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "formats/image/image.h"
#include "formats/image/watermark.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

nlohmann::json klein_metadata(const fs::path& png) {
  for (const auto& [k, v] : read_image_metadata(png))
    if (k == "klein") return nlohmann::json::parse(v);
  return {};
}

int generate(const fs::path& out, const std::string& size, const std::string& extra) {
  std::string log;
  const int rc = testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                        " -p 'a fox' " + size + " -s 1 --seed 2 --no-cache -q " +
                                        extra + " -o " + testing::shell_arg(out),
                                    &log);
  EXPECT_EQ(rc, 0) << log;
  return rc;
}

// (5) --no-watermark leaves the pixels as the pipeline made them: marking that image gives the
// default output exactly; `klein watermark --check` finds the mark in one and not the other.
TEST(WatermarkCli, GenerateMarksByDefaultAndNoWatermarkLeavesThePixels) {
  const fs::path dir = testing::temp_dir("watermark-cli");
  ASSERT_EQ(generate(dir / "marked.png", "-W 256 -H 256", ""), 0);
  ASSERT_EQ(generate(dir / "plain.png", "-W 256 -H 256", "--no-watermark"), 0);
  const Image marked = load_image(dir / "marked.png");
  Image plain = load_image(dir / "plain.png");
  EXPECT_NE(marked.rgb, plain.rgb);
  embed_watermark(plain, flux_watermark_bits());
  EXPECT_EQ(marked.rgb, plain.rgb);

  const nlohmann::json m = klein_metadata(dir / "marked.png");
  EXPECT_EQ(m["watermark"]["embedded"], true);
  EXPECT_EQ(m["watermark"]["bits"], "1010101111111010000111100111001111010100101110");
  EXPECT_EQ(klein_metadata(dir / "plain.png")["watermark"]["embedded"], false);

  std::string out;
  EXPECT_EQ(testing::run_klein("watermark --check " + testing::shell_arg(dir / "marked.png"), &out), 0)
      << out;
  EXPECT_NE(out.find("found: FLUX's mark"), std::string::npos) << out;
  EXPECT_EQ(testing::run_klein("watermark --json --check " + testing::shell_arg(dir / "plain.png"),
                               &out),
            2)
      << out;
  EXPECT_NE(out.find("\"flux_mark\":false"), std::string::npos) << out;
  EXPECT_NE(testing::run_klein("watermark --check " + testing::shell_arg(dir / "missing.png"), &out),
            0);
  EXPECT_NE(out.find("missing.png"), std::string::npos) << out;
}

// (4) Smaller than the method needs: unmarked, with the note in the metadata.
TEST(WatermarkCli, TooSmallImagesAreLeftUnmarkedWithANote) {
  const fs::path dir = testing::temp_dir("watermark-small");
  ASSERT_EQ(generate(dir / "small.png", "-W 64 -H 64", ""), 0);
  ASSERT_EQ(generate(dir / "plain.png", "-W 64 -H 64", "--no-watermark"), 0);
  EXPECT_EQ(load_image(dir / "small.png").rgb, load_image(dir / "plain.png").rgb);
  const nlohmann::json w = klein_metadata(dir / "small.png")["watermark"];
  EXPECT_EQ(w["embedded"], false);
  EXPECT_NE(w["note"].get<std::string>().find("smaller than the dwtDct method needs"),
            std::string::npos)
      << w.dump();
}

}  // namespace
}  // namespace klein
