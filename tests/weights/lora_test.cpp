// --lora FILE[:SCALE] arguments. (Applying the files is tested end to end in tests/e2e.)
#include <gtest/gtest.h>

#include "support/testing.h"
#include "weights/lora.h"

namespace klein {
namespace {

TEST(LoraArgument, FileAndOptionalScale) {
  LoraFile f = parse_lora_argument("style.safetensors");
  EXPECT_EQ(f.path, "style.safetensors");
  EXPECT_EQ(f.scale, 1.0f);
  f = parse_lora_argument("/data/loras/style.safetensors:0.75");
  EXPECT_EQ(f.path, "/data/loras/style.safetensors");
  EXPECT_EQ(f.scale, 0.75f);
  f = parse_lora_argument("style.safetensors:-1.5");
  EXPECT_EQ(f.scale, -1.5f);
  // A suffix that is not a number belongs to the path.
  f = parse_lora_argument("dir:with:colons/style.safetensors");
  EXPECT_EQ(f.path, "dir:with:colons/style.safetensors");
  EXPECT_EQ(f.scale, 1.0f);
  EXPECT_EQ(lora_label(parse_lora_argument("a/b/style.safetensors:0.5")), "style:0.5");
  EXPECT_NE(testing::error_of([] { parse_lora_argument(":0.5"); }).find("expected FILE"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_lora_argument("x.safetensors:inf"); }).find("finite"),
            std::string::npos);
}

}  // namespace
}  // namespace klein
