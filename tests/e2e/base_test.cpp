// klein-base against the official pipeline (tests/data/klein-tiny-base, made by
// tools/refgen/gen_base.py): diffusers' Flux2KleinPipeline on the tiny model under a
// model_index.json that declares a base checkpoint, so every step runs the transformer on the
// prompt and on the negative prompt and guides with neg + g * (cond - neg). One case takes the
// pipeline's defaults (50 steps and their schedule, guidance 4, the empty negative prompt), the
// other a negative prompt, guidance 3 and 6 steps at a non-square size.
#include <gtest/gtest.h>

#include <filesystem>

#include "e2e/golden_dump.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path base_set(const std::string& name) {
  return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "klein-tiny-base" / "vectors" / "base" /
         name;
}

// The tiny model's components under a model_index.json with "is_distilled": false, as
// gen_base.py gives them to the official pipeline.
fs::path base_model() {
  return testing::tiny_model_declared_as("base-model", "\"is_distilled\": true",
                                         "\"is_distilled\": false");
}

struct BaseCase {
  const char* name;
  const char* prompt;
  int width, height;
  int steps;              // what the official run took (its default when options is empty)
  const char* options;    // steps, guidance, negative prompt as given to klein generate
};

class KleinBase : public ::testing::TestWithParam<BaseCase> {};

TEST_P(KleinBase, MatchesTheOfficialPipelineAtEveryStep) {
  const BaseCase& c = GetParam();
  const fs::path ref = base_set(c.name);
  const fs::path out = testing::temp_dir(std::string("base-") + c.name);
  const std::string args = "generate -m " + testing::shell_arg(base_model()) + " -p \"" +
                           c.prompt + "\" -W " + std::to_string(c.width) + " -H " +
                           std::to_string(c.height) + c.options + " --noise " +
                           testing::shell_arg(ref / "noise.npy") + " --dump " +
                           testing::shell_arg(out / "dump") + " -o " +
                           testing::shell_arg(out / "image.png") + " --no-cache --threads 2 -q";
  std::string log;
  ASSERT_EQ(testing::run_klein(args, &log), 0) << log;
  // Every step's timestep (the base schedule), latents and guided velocity, both contexts.
  testing::expect_dump_matches(
      out / "dump", ref, {"prompt_embeds", "negative_prompt_embeds", "final_latents", "image"},
      c.steps);
  testing::expect_png_matches(out / "image.png", ref / "image.png", c.width, c.height);
}

INSTANTIATE_TEST_SUITE_P(
    TinyModel, KleinBase,
    ::testing::Values(BaseCase{"base_defaults_h48_w48", "a red cube on a table", 48, 48, 50, ""},
                      BaseCase{"base_negative_g3_h64_w96", "a lighthouse on a rocky coast at dusk",
                               96, 64, 6,
                               " -s 6 -g 3 --negative \"blurry, low quality\""}),
    [](const ::testing::TestParamInfo<BaseCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace klein
