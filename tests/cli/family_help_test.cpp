// The help texts name the families this build registers, read from their entries rather than
// written into the CLI: every family's title in `klein --help`, `convert --help` and -m's
// help, and every --variant name with what it runs in the help of the commands that open a
// model. A family added to the registry appears there without an edit of the CLI.
#include <gtest/gtest.h>

#include <string>

#include "support/testing.h"
#include "weights/family.h"

namespace klein {
namespace {

// CLI11 folds long help lines: compare with runs of white space made one space.
std::string one_line(const std::string& text) {
  std::string out;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  return out;
}

TEST(FamilyHelp, EveryRegisteredFamilyIsNamedWithItsVariants) {
  ASSERT_GE(model_families().size(), 3u);
  std::string top, generate, convert;
  ASSERT_EQ(testing::run_klein("--help", &top), 0) << top;
  ASSERT_EQ(testing::run_klein("generate --help", &generate), 0) << generate;
  ASSERT_EQ(testing::run_klein("convert --help", &convert), 0) << convert;
  top = one_line(top);
  generate = one_line(generate);
  convert = one_line(convert);
  for (const ModelFamily* f : model_families()) {
    SCOPED_TRACE(std::string(f->id()));
    const std::string title(f->title());
    EXPECT_NE(top.find(title), std::string::npos) << top;
    EXPECT_NE(convert.find(title), std::string::npos) << convert;
    EXPECT_NE(generate.find(one_line(f->variants_help())), std::string::npos) << generate;
    const std::string help = f->variants_help();
    for (const std::string& name : f->variant_names()) {
      const bool described =
          help.find(name + ":") != std::string::npos || help.find(name + ",") != std::string::npos;
      EXPECT_TRUE(described) << name << " is not described in: " << help;
    }
  }
}

}  // namespace
}  // namespace klein
