// Z-Image through the engine's front door: `klein generate -m <zimage-tiny/model>` with the
// official initial noise reproduces every stage of the four ZImagePipeline runs of
// ../shared/testdata/zimage-tiny (vectors/e2e): the prompt's (and negative prompt's)
// features, each step's model time, latents and velocity, the final latents, the decoder's
// input and output, the image in [0, 1] and the PNG. Turbo runs without guidance, strong CFG,
// and CFG with normalisation and truncation. A container converted from the same files gives
// the same numbers, and what Z-Image cannot do is refused by name before any work.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using testing::zimage_model;

struct Case {
  const char* name;
  double tolerance;  // the set's free-running target for the late stages (README)
};

// The generate command of one official run, its settings read from case.json.
std::string command_for(const fs::path& model, const fs::path& ref, const fs::path& out) {
  const json c = json::parse(read_text_file(ref / "case.json"));
  std::string args = "generate -m " + testing::shell_arg(model) + " -p " +
                     testing::shell_arg(c["prompt"].get<std::string>()) + " -s " +
                     std::to_string(c["steps"].get<int>()) + " -W " +
                     std::to_string(c["width"].get<int>()) + " -H " +
                     std::to_string(c["height"].get<int>()) + " -g " +
                     std::to_string(c["guidance_scale"].get<double>());
  if (c.contains("negative_prompt") && c["negative_prompt"].is_string())
    args += " -n " + testing::shell_arg(c["negative_prompt"].get<std::string>());
  if (c.contains("cfg_normalization")) {
    const json& n = c["cfg_normalization"];
    args += " --cfg-normalization " +
            std::string(n.is_boolean() ? (n.get<bool>() ? "1" : "0") : std::to_string(n.get<double>()));
  }
  if (c.contains("cfg_truncation"))
    args += " --cfg-truncation " + std::to_string(c["cfg_truncation"].get<double>());
  return args + " --noise " + testing::shell_arg(ref / "noise.npy") + " --dump " +
         testing::shell_arg(out / "dump") + " -o " + testing::shell_arg(out / "image.png") +
         " --no-cache --threads 2 -q";
}

void expect_close(const fs::path& got, const fs::path& want, double tolerance) {
  const std::vector<float> g = read_npy(got).to_f32();
  EXPECT_TRUE(testing::matches_npy(g.data(), int64_t(g.size()), want, tolerance)) << got;
}

class ZImageCli : public ::testing::TestWithParam<Case> {};

TEST_P(ZImageCli, MatchesTheOfficialPipelineAtEveryStage) {
  const Case& c = GetParam();
  const fs::path ref = testing::golden_vectors("zimage-tiny", "e2e") / c.name;
  const fs::path out = testing::temp_dir(std::string("zimage-") + c.name);
  std::string log;
  ASSERT_EQ(testing::run_klein(command_for(zimage_model(), ref, out), &log), 0) << log;

  const fs::path dump = out / "dump";
  const json info = json::parse(read_text_file(ref / "case.json"));
  const bool guided = info["guidance_scale"].get<double>() > 0;
  expect_close(dump / "prompt_embeds.npy", ref / "prompt_embeds.npy", 1e-4);
  if (guided)
    expect_close(dump / "negative_prompt_embeds.npy", ref / "negative_prompt_embeds.npy", 1e-4);
  const int steps = info["steps"].get<int>();
  for (int i = 0; i < steps; ++i) {
    const std::string p = "step" + std::to_string(i) + "_";
    // The model time is the schedule's, exactly (CFG runs hold it once per batch item).
    const std::vector<float> t = read_npy(dump / (p + "t_model.npy")).to_f32();
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0], read_npy(ref / (p + "t_model.npy")).to_f32().front()) << p;
    for (const char* part : {"latents_in", "velocity", "latents_out"})
      expect_close(dump / (p + part + ".npy"), ref / (p + part + ".npy"), c.tolerance);
  }
  EXPECT_FALSE(fs::exists(dump / ("step" + std::to_string(steps) + "_velocity.npy")));
  for (const char* f : {"final_latents", "vae_input", "image_decoded", "image"})
    expect_close(dump / (std::string(f) + ".npy"), ref / (std::string(f) + ".npy"), c.tolerance);
  testing::expect_png_matches(out / "image.png", ref / "image.png", info["width"].get<int>(),
                              info["height"].get<int>());

  // The metadata records what took effect.
  std::string parameters, record;
  for (const auto& [k, v] : read_image_metadata(out / "image.png")) {
    if (k == "parameters") parameters = v;
    if (k == "klein") record = v;
  }
  // The engine's own record keeps Z-Image's convention, so that giving its guidance back
  // gives the same image: 0 when no guidance ran (1 would run CFG in ZImagePipeline).
  ASSERT_FALSE(record.empty());
  EXPECT_EQ(json::parse(record)["guidance"].get<double>(),
            guided ? info["guidance_scale"].get<double>() : 0.0)
      << record;
  EXPECT_NE(parameters.find("Steps: " + std::to_string(steps)), std::string::npos) << parameters;
  EXPECT_EQ(parameters.find("Negative prompt") != std::string::npos,
            guided && info.contains("negative_prompt") && info["negative_prompt"].is_string())
      << parameters;
}

INSTANTIATE_TEST_SUITE_P(OfficialRuns, ZImageCli,
                         ::testing::Values(Case{"turbo_h64_w96", 1e-4}, Case{"turbo_h80_w64", 1e-4},
                                           Case{"cfg_h64_w64", 5e-4},
                                           Case{"cfg_norm_trunc_h48_w80", 1e-4}),
                         [](const auto& info) { return std::string(info.param.name); });

// Converted to a container (bf16, as the checkpoint stores it), the model is the same model:
// the container names its family, and a generation from it equals the one from the directory.
TEST(ZImageCli, ContainerGivesTheSameGeneration) {
  const fs::path dir = testing::temp_dir("zimage-container");
  const fs::path container = dir / "zimage.klein";
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(zimage_model()) + " -t bf16 -o " +
                                   testing::shell_arg(container) + " -q",
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("inspect -m " + testing::shell_arg(container), &log), 0) << log;
  EXPECT_NE(log.find("(Z-Image)"), std::string::npos) << log;

  const fs::path ref = testing::golden_vectors("zimage-tiny", "e2e") / "turbo_h80_w64";
  const fs::path from_dir = dir / "dir", from_container = dir / "container";
  fs::create_directories(from_dir);
  fs::create_directories(from_container);
  ASSERT_EQ(testing::run_klein(command_for(zimage_model(), ref, from_dir), &log), 0) << log;
  ASSERT_EQ(testing::run_klein(command_for(container, ref, from_container), &log), 0) << log;
  for (const char* f : {"prompt_embeds", "final_latents", "image"}) {
    const std::string name = std::string(f) + ".npy";
    EXPECT_EQ(read_npy(from_dir / "dump" / name).to_f32(),
              read_npy(from_container / "dump" / name).to_f32())
        << f;
  }
}

// The record of a generation (the PNG's "klein" metadata).
json generation_record(const fs::path& png) {
  for (const auto& [k, v] : read_image_metadata(png))
    if (k == "klein") return json::parse(v);
  ADD_FAILURE() << png << " has no klein metadata";
  return {};
}

// Turbo and the base model share the layout and model_index.json: --variant picks the
// defaults (8 steps without guidance, or the pipeline's 50 steps with guidance 5), and a
// container keeps the variant it was converted with.
TEST(ZImageCli, VariantPicksTheDefaults) {
  const fs::path dir = testing::temp_dir("zimage-variant");
  const std::string model = testing::shell_arg(zimage_model());
  auto generate = [&](const std::string& m, const std::string& args, const fs::path& out) {
    std::string log;
    EXPECT_EQ(testing::run_klein("generate -m " + m + " -p x -W 32 -H 32 --seed 1 --no-cache -q " +
                                     args + " -o " + testing::shell_arg(out),
                                 &log),
              0)
        << log;
    return generation_record(out);
  };
  const json turbo = generate(model, "", dir / "turbo.png");
  EXPECT_EQ(turbo["steps"], 8);
  EXPECT_EQ(turbo["guidance"].get<double>(), 0.0);
  const json base = generate(model, "--variant zimage", dir / "base.png");
  EXPECT_EQ(base["steps"], 50);
  EXPECT_EQ(base["guidance"].get<double>(), 5.0);

  std::string log;
  const fs::path container = dir / "z-base.klein";
  ASSERT_EQ(testing::run_klein("convert -m " + model + " --variant zimage -t bf16 -q -o " +
                                   testing::shell_arg(container),
                               &log),
            0)
      << log;
  ASSERT_EQ(testing::run_klein("inspect -m " + testing::shell_arg(container), &log), 0) << log;
  EXPECT_NE(log.find("Z-Image (base): 50 steps"), std::string::npos) << log;
  EXPECT_EQ(generate(testing::shell_arg(container), "-s 2", dir / "c.png")["guidance"].get<double>(),
            5.0);
  const fs::path refused = dir / "refused.png";
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(container) +
                                   " --variant zimage-turbo -p x -W 32 -H 32 -q -o " +
                                   testing::shell_arg(refused),
                               &log),
            0);
  EXPECT_NE(log.find("was converted as zimage"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(refused));
}

// What ZImagePipeline has no counterpart for is refused by name, before the model runs, and
// no image is written.
TEST(ZImageCli, RefusesWhatTheFamilyCannotDo) {
  const fs::path dir = testing::temp_dir("zimage-refusals");
  struct Refusal {
    std::string args, expected;
  };
  const fs::path some_png = dir / "in.png";
  save_image(some_png, Image(32, 32));
  for (const Refusal& r : std::vector<Refusal>{
           {"-r " + testing::shell_arg(some_png), "--reference: not available with Z-Image"},
           {"--mask " + testing::shell_arg(some_png), "--mask needs --init-image"},
           {"--variant 4b", "is a Z-Image model; expected zimage-turbo or zimage"},
           {"--max-memory 1M", "--max-memory"},
           {"-g -1", "-g/--guidance"},
           {"--cache first-block:-1", "--cache: expected first-block:T with a threshold T of 0"},
           {"--cache fbc", "--cache: expected first-block:T"},
           {"-g 4 --cfg-truncation -1 --cache first-block:0.1",
            "--cache with --cfg-truncation -1: step 1 runs without guidance"},
           {"--control-image " + testing::shell_arg(some_png) + " --cache first-block:0.1",
            "--cache: not with --control-image"}}) {
    std::string log;
    const fs::path out = dir / "out.png";
    EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(zimage_model()) +
                                     " -p x -W 32 -H 32 -s 1 --no-cache -q " + r.args + " -o " +
                                     testing::shell_arg(out),
                                 &log),
              0)
        << r.args;
    EXPECT_NE(log.find(r.expected), std::string::npos) << r.args << ": " << log;
    EXPECT_FALSE(fs::exists(out)) << r.args;
  }
}

// Step caching through the CLI, from the prompt's text: the official cached run of
// tests/data/zimage-cache/cfg (diffusers' FirstBlockCache on ZImagePipeline, 20 steps with
// guidance 4 from the set's cfg_h64_w64 case): as many calls computed and skipped, the final
// latents within the set's free-running target under guidance; the JSON result and the image's
// metadata say what the cache did. At threshold 0 nothing is skipped and the pixels are the
// uncached run's.
TEST(ZImageCli, StepCacheMakesTheOfficialCachedRun) {
  const fs::path ref = testing::golden_vectors("zimage-tiny", "e2e") / "cfg_h64_w64";
  const fs::path cached = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "zimage-cache" / "cfg";
  const json info = json::parse(read_text_file(cached / "case.json"));
  const json source = json::parse(read_text_file(ref / "case.json"));
  const fs::path out = testing::temp_dir("zimage-step-cache");
  auto command = [&](const std::string& cache, const std::string& name) {
    return "generate -m " + testing::shell_arg(zimage_model()) + " -p " +
           testing::shell_arg(source["prompt"].get<std::string>()) + " -n " +
           testing::shell_arg(source["negative_prompt"].get<std::string>()) + " -s " +
           std::to_string(info["steps"].get<int>()) + " -g 4 -W 64 -H 64 --noise " +
           testing::shell_arg(ref / "noise.npy") + " --no-cache --threads 2 --json " + cache +
           " --dump " + testing::shell_arg(out / (name + "-dump")) + " -o " +
           testing::shell_arg(out / (name + ".png"));
  };
  std::string log;
  ASSERT_EQ(testing::run_klein(command("--cache first-block:" +
                                           std::to_string(info["threshold"].get<double>()),
                                       "cached"),
                               &log),
            0)
      << log;
  const std::string last = log.substr(log.rfind("{\"event\":\"result\""));
  const json result = json::parse(last.substr(0, last.find('\n')));
  EXPECT_EQ(result["step_cache"]["method"], "first-block") << last;
  EXPECT_EQ(result["step_cache"]["computed"], info["computed"]) << last;
  EXPECT_EQ(result["step_cache"]["skipped"], info["skipped"]) << last;
  const std::vector<float> final_latents =
      read_npy(out / "cached-dump" / "final_latents.npy").to_f32();
  EXPECT_TRUE(testing::matches_npy(final_latents.data(), int64_t(final_latents.size()),
                                   cached / "final_latents.npy", 5e-4));
  std::string record;
  for (const auto& [k, v] : read_image_metadata(out / "cached.png"))
    if (k == "klein") record = v;
  ASSERT_FALSE(record.empty());
  EXPECT_EQ(json::parse(record)["step_cache"]["skipped"], info["skipped"]) << record;

  ASSERT_EQ(testing::run_klein(command("--cache first-block:0", "zero"), &log), 0) << log;
  ASSERT_EQ(testing::run_klein(command("", "plain"), &log), 0) << log;
  const Image zero = load_image(out / "zero.png"), plain = load_image(out / "plain.png");
  EXPECT_TRUE(zero.rgb == plain.rgb);
  EXPECT_EQ(log.find("step_cache"), std::string::npos) << "no cache, no record: " << log;
}

// A noise file of another size is refused when the generation starts, before the text encoder
// runs (its progress line would name it).
TEST(ZImageCli, RefusesANoiseFileOfAnotherSizeBeforeAnyWork) {
  const fs::path dir = testing::temp_dir("zimage-noise-size");
  const fs::path noise =
      testing::golden_vectors("zimage-tiny", "e2e") / "turbo_h64_w96" / "noise.npy";
  std::string log;
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(zimage_model()) +
                                   " -p x -W 32 -H 32 -s 1 --no-cache --noise " +
                                   testing::shell_arg(noise) + " -o " +
                                   testing::shell_arg(dir / "out.png"),
                               &log),
            0);
  EXPECT_NE(log.find("--noise"), std::string::npos) << log;
  EXPECT_NE(log.find("expected float32 [1, 16, 4, 4]"), std::string::npos) << log;
  EXPECT_EQ(log.find("text encoder"), std::string::npos) << "work started: " << log;
  EXPECT_TRUE(fs::is_empty(dir));
}

}  // namespace
}  // namespace klein
