// Canny edges (formats/image/canny.h) against OpenCV's cv2.Canny on fixed images and thresholds
// (tests/data/canny, made by tools/control/canny_fixtures.py with Debian's python3-opencv):
// every pixel equal, for RGB and grey images, the ControlNet preprocessors' 100/200, swapped and
// fractional thresholds, and an odd size.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/files.h"
#include "formats/image/canny.h"
#include "formats/image/image.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

const fs::path kDir = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "canny";

TEST(Canny, EveryPixelIsOpenCvs) {
  const nlohmann::json manifest = nlohmann::json::parse(read_text_file(kDir / "manifest.json"));
  int cases = 0, edges_total = 0;
  for (const auto& c : manifest["cases"]) {
    const std::string what = c["edges"].get<std::string>();
    const Image input = load_image(kDir / c["input"].get<std::string>());
    const Image want = load_image(kDir / what);  // grey, read as RGB
    const Image got = canny_edges(input, c["low"].get<double>(), c["high"].get<double>());
    ASSERT_EQ(got.width, want.width) << what;
    ASSERT_EQ(got.height, want.height) << what;
    int differ = 0, edges = 0;
    for (size_t i = 0; i < got.rgb.size(); ++i) differ += got.rgb[i] != want.rgb[i];
    for (size_t i = 0; i < got.rgb.size(); i += 3) edges += got.rgb[i] == 255;
    EXPECT_EQ(differ, 0) << what;
    EXPECT_EQ(edges, c["edge_pixels"].get<int>()) << what;
    edges_total += edges;
    ++cases;
  }
  EXPECT_EQ(cases, 20);
  EXPECT_GT(edges_total, 10000);  // the fixtures have edges to find
}

TEST(Canny, RefusesThresholdsThatAreNotNumbers) {
  EXPECT_THROW(canny_edges(Image(4, 4), std::nan(""), 200), Error);
}

}  // namespace
}  // namespace klein
