// LoRA adapters at run time (--lora) against the reference merge: tools/lora/lora_fixture.py
// merges the same files into the tiny transformer's weights in float64 (independently of the
// engine, following diffusers' FLUX.2 key conversion), and `generate` on the merged weights is
// what `generate --lora` on the original weights must give, step by step.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

using testing::kSource;

using testing::shell_arg;
using testing::tiny_components;

// One of the LoRA fixtures (tools/lora/lora_fixture.py make, run once by the test program).
fs::path lora_file(const std::string& name) {
  const std::string file = name.find('.') == std::string::npos ? name + ".safetensors" : name;
  return testing::lora_fixtures() / file;
}

using testing::kRun;

// The reference: the LoRAs merged into the tiny transformer by the fixture script.
fs::path reference_merge(const fs::path& dir, const std::string& loras) {
  const fs::path out = dir / "merged.safetensors";
  const std::string cmd =
      "python3 " + shell_arg(kSource / "tools" / "lora" / "lora_fixture.py") + " merge " +
      shell_arg(testing::tiny_model() / "transformer" / "diffusion_pytorch_model.safetensors") +
      " " + shell_arg(out) + " " + loras;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  return out;
}

struct LoraCase {
  const char* name;
  const char* loras;  // for the merge script: FILE[:SCALE] ...
};

class LoraMatchesMerge : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraMatchesMerge, AtEveryStep) {
  const LoraCase& c = GetParam();
  const fs::path dir = testing::temp_dir(std::string("lora-") + c.name);
  // Files relative to the fixture directory, for both the script and --lora.
  std::string merge_args, lora_args;
  for (std::string rest = c.loras; !rest.empty();) {
    const size_t space = rest.find(' ');
    const std::string one = rest.substr(0, space);
    rest = space == std::string::npos ? "" : rest.substr(space + 1);
    merge_args += " " + shell_arg(lora_file(one));
    lora_args += " --lora " + shell_arg(lora_file(one));
  }
  const fs::path merged = reference_merge(dir, merge_args);
  ASSERT_TRUE(fs::exists(merged));

  std::string log;
  ASSERT_TRUE(testing::generate_compared_run(tiny_components(merged), dir, "merged"));
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(testing::tiny_model()) + lora_args,
                                             dir, "lora"));
  testing::expect_dump_matches(dir / "lora", dir / "merged", {"final_latents"}, 4);
  testing::expect_png_matches(dir / "lora.png", dir / "merged.png", 64, 64);

  // The adapters change the image (the comparison above could not pass without them).
  ASSERT_EQ(testing::run_klein("generate -m " + shell_arg(testing::tiny_model()) + kRun + " -o " +
                                   shell_arg(dir / "plain.png"),
                               &log),
            0)
      << log;
  EXPECT_NE(read_text_file(dir / "plain.png"), read_text_file(dir / "lora.png"));
  // The metadata names them.
  EXPECT_NE(read_text_file(dir / "lora.png").find("LoRA: "), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(TinyModel, LoraMatchesMerge,
                         ::testing::Values(
                             // diffusers/PEFT (BF16), BFL/ai-toolkit (fused QKV, final-layer swap,
                             // alpha) and kohya (lora_down/up, alpha, a user scale) at once.
                             LoraCase{"all",
                                      "peft.safetensors bfl.safetensors kohya.safetensors:0.7"},
                             LoraCase{"bfl_negative", "bfl.safetensors:-0.5"}),
                         [](const auto& info) { return std::string(info.param.name); });

// On a quantized container the updates run beside the Q8 weights: the result is the merged
// reference's within the container's quantization error, and not the plain container's.
TEST(LoraOnContainer, AddsTheUpdatesBesideQuantizedWeights) {
  const fs::path dir = testing::temp_dir("lora-container");
  const fs::path merged = reference_merge(dir, shell_arg(lora_file("bfl")));
  const fs::path container = dir / "tiny-q8.klein";
  std::string log;
  ASSERT_TRUE(testing::convert_tiny(container, "-t q8 -q"));
  ASSERT_TRUE(testing::generate_compared_run(tiny_components(merged), dir, "merged"));
  ASSERT_TRUE(testing::generate_compared_run(
      " -m " + shell_arg(container) + " --lora " + shell_arg(lora_file("bfl")), dir, "lora"));
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(container), dir, "plain"));
  const Tensor ref = read_npy(dir / "merged" / "final_latents.npy").to_tensor();
  const Tensor lora = read_npy(dir / "lora" / "final_latents.npy").to_tensor();
  const Tensor plain = read_npy(dir / "plain" / "final_latents.npy").to_tensor();
  const double with = testing::scaled_diff(lora.data(), ref.data(), ref.numel());
  const double without = testing::scaled_diff(plain.data(), ref.data(), ref.numel());
  EXPECT_LT(with, 0.06);  // the tiny Q8 container alone is 0.04 from its source
  EXPECT_GT(without, 5 * with) << "with " << with << ", without " << without;
}

// `convert --lora` merges before storing: an f32 container made that way gives the reference
// merge's result, records the LoRA, and -q prints nothing.
TEST(LoraMergedByConvert, MatchesTheReferenceMerge) {
  const fs::path dir = testing::temp_dir("lora-convert");
  const fs::path bfl = lora_file("bfl"), kohya = lora_file("kohya");
  const fs::path merged =
      reference_merge(dir, shell_arg(bfl) + " " + shell_arg(kohya.string() + ":0.7"));
  const fs::path container = dir / "merged.klein";
  std::string log;
  ASSERT_EQ(
      testing::run_klein("convert -m " + shell_arg(testing::tiny_model()) + " --lora " +
                             shell_arg(bfl) + " --lora " + shell_arg(kohya.string() + ":0.7") +
                             " -t f32 -q -o " + shell_arg(container),
                         &log),
      0)
      << log;
  EXPECT_EQ(log, "");
  ASSERT_TRUE(testing::generate_compared_run(tiny_components(merged), dir, "reference"));
  ASSERT_TRUE(testing::generate_compared_run(" -m " + shell_arg(container), dir, "container"));
  testing::expect_dump_matches(dir / "container", dir / "reference", {"final_latents"}, 4);
  ASSERT_EQ(testing::run_klein("inspect " + shell_arg(container) + " --json", &log), 0) << log;
  EXPECT_NE(log.find("merged_loras"), std::string::npos) << log.substr(0, 2000);
  EXPECT_NE(log.find("kohya.safetensors"), std::string::npos);
}

// Files that cannot be applied are refused before any work, naming the file and the tensor,
// and no image is written.
TEST(LoraErrors, RefusedBeforeAnyWork) {
  const fs::path dir = testing::temp_dir("lora-errors");
  const fs::path m = testing::tiny_model();
  const fs::path out = dir / "x.png";
  auto refused = [&](const std::string& lora, const std::string& expected) {
    std::string log;
    EXPECT_NE(testing::run_klein("generate -m " + shell_arg(m) + " --lora " + lora + kRun + " -o " +
                                     shell_arg(out),
                                 &log),
              0)
        << lora;
    EXPECT_NE(log.find(expected), std::string::npos) << "expected '" << expected << "' in:\n"
                                                     << log;
    EXPECT_FALSE(fs::exists(out));
  };
  refused(shell_arg(dir / "missing.safetensors"), "missing.safetensors: no such file");
  refused(shell_arg(lora_file("bfl")) + ":abc", "no such file");

  // Made with the fixture script's writer: a module for another model's width, a
  // text-encoder LoRA, a module with A but no B, a DoRA magnitude.
  auto write = [&](const std::string& name, const std::string& tensors) {
    const std::string cmd = "python3 -c \"import sys; sys.path.insert(0, '" +
                            (kSource / "tools" / "lora").string() +
                            "'); import lora_fixture as f; f.write_safetensors('" +
                            (dir / name).string() + "', {" + tensors + "})\"";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return shell_arg(dir / name);
  };
  refused(write("wide.safetensors",
                "'transformer.transformer_blocks.0.attn.to_q.lora_A.weight': ('F32', [2, 512], "
                "[0.0]*1024),"
                "'transformer.transformer_blocks.0.attn.to_q.lora_B.weight': ('F32', [512, 2], "
                "[0.0]*1024)"),
          "made for another model");
  refused(write("te.safetensors",
                "'lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight': ('F32', [1, 4], "
                "[0.0]*4),"
                "'lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight': ('F32', [4, 1], "
                "[0.0]*4)"),
          "adapts the text encoder");
  refused(write("half.safetensors",
                "'diffusion_model.single_blocks.0.linear2.lora_A.weight': ('F32', [2, 1024], "
                "[0.0]*2048)"),
          "single_blocks.0.linear2 has A");
  refused(write("dora.safetensors",
                "'transformer.proj_out.lora_A.weight': ('F32', [1, 256], [0.0]*256),"
                "'transformer.proj_out.lora_B.weight': ('F32', [128, 1], [0.0]*128),"
                "'transformer.proj_out.lora_magnitude_vector': ('F32', [128], [1.0]*128)"),
          "lora_magnitude_vector is not a LoRA A, B or alpha tensor");
  refused(write("nan.safetensors",
                "'transformer.proj_out.lora_A.weight': ('F32', [1, 256], [float('nan')]*256),"
                "'transformer.proj_out.lora_B.weight': ('F32', [128, 1], [0.0]*128)"),
          "NaN or Inf");
}

}  // namespace
}  // namespace klein
