// Every image the engine writes says it was made by a generative model, in the vocabulary the
// standards use (IPTC's digital source type, in XMP), and a real metadata reader finds it:
// Debian's exiftool (libimage-exiftool-perl, installed by scripts/test.sh) reads PNG and JPEG
// files `klein generate` wrote, text-to-image and edits.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

// `exiftool -s -XMP:all FILE`: "Tag : value" lines.
std::string exiftool(const fs::path& file) {
  std::string out;
  const std::string cmd = "exiftool -s -XMP:all " + testing::shell_arg(file) + " 2>&1";
  if (std::FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    EXPECT_EQ(::pclose(p), 0) << "exiftool failed (is libimage-exiftool-perl installed?): "
                              << out;
  }
  return out;
}

std::string field(const std::string& listing, const std::string& tag) {
  const size_t at = listing.find("\n" + tag + " ");
  const size_t start = at == std::string::npos ? listing.rfind(tag + " ", 0) : at + 1;
  if (start == std::string::npos) return "";
  const size_t colon = listing.find(": ", start);
  return listing.substr(colon + 2, listing.find('\n', colon) - colon - 2);
}

TEST(Provenance, GeneratedImagesCarryTheIptcDigitalSourceTypeInXmp) {
  const fs::path out = testing::temp_dir("provenance");
  const std::string model = "-m " + testing::shell_arg(testing::tiny_model());
  const std::string common = " -W 64 -H 64 -s 1 --seed 2 --no-cache -q ";
  std::string log;
  ASSERT_EQ(testing::run_klein("generate " + model + " -p 'a fox & a \"cat\" <3'" + common +
                                   "-o " + testing::shell_arg(out / "t2i.png"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate " + model + " -p 'a fox'" + common + "-o " +
                                   testing::shell_arg(out / "t2i.jpg"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate " + model + " -p 'make it night'" + common + "-r " +
                                   testing::shell_arg(out / "t2i.png") + " -o " +
                                   testing::shell_arg(out / "edit.jpg"),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("generate " + model + " -p 'make it night'" + common +
                                   "--init-image " + testing::shell_arg(out / "t2i.png") +
                                   " --strength 1 -o " + testing::shell_arg(out / "img2img.png"),
                               &log),
            0)
      << log;

  const std::string iptc = "http://cv.iptc.org/newscodes/digitalsourcetype/";
  for (const char* name : {"t2i.png", "t2i.jpg"}) {
    SCOPED_TRACE(name);
    const std::string x = exiftool(out / name);
    EXPECT_EQ(field(x, "DigitalSourceType"), iptc + "trainedAlgorithmicMedia") << x;
    EXPECT_EQ(field(x, "CreatorTool").rfind("klein ", 0), 0u) << x;
    EXPECT_EQ(field(x, "AISystemUsed"), "model") << x;
  }
  EXPECT_EQ(field(exiftool(out / "t2i.png"), "AIPromptInformation"), "a fox & a \"cat\" <3");
  for (const char* name : {"edit.jpg", "img2img.png"}) {
    SCOPED_TRACE(name);
    const std::string x = exiftool(out / name);
    EXPECT_EQ(field(x, "DigitalSourceType"), iptc + "compositeWithTrainedAlgorithmicMedia") << x;
    EXPECT_EQ(field(x, "AIPromptInformation"), "make it night") << x;
  }
}

}  // namespace
}  // namespace klein
