// Z-Image with a control model through the engine's front door: `klein generate --controlnet
// --control-image` (and with --init-image and --mask, inpainting guided by it) reproduces every
// stage of diffusers' ZImageControlNetPipeline and ZImageControlNetInpaintPipeline on
// ../shared/testdata/zimage-control (a tiny Z-Image and a tiny control model of the Union 2.1
// structure): the preprocessed images, their VAE means, the control context, every step, the
// final latents, the decoder's output, the image and the PNG. The original single file makes the
// directory's image, and what cannot run is refused by name before any work.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "e2e/golden_dump.h"
#include "formats/image/image.h"
#include "support/testing.h"

namespace klein {
namespace zimage_control_test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path set_dir() { return testing::tiny_dir().parent_path() / "zimage-control"; }
fs::path case_dir(const std::string& name) { return set_dir() / "vectors" / "e2e" / name; }

// The case's command; `controlnet` empty: none given (the container's), `model` empty: the set's.
std::string command_for(const fs::path& ref, const fs::path& controlnet, const fs::path& out,
                        const fs::path& model = {}) {
  const json c = json::parse(read_text_file(ref / "case.json"));
  std::string args = "generate -m " + testing::shell_arg(model.empty() ? set_dir() / "model" : model) + " -p " +
                     testing::shell_arg(c["prompt"].get<std::string>()) + " -s " +
                     std::to_string(c["steps"].get<int>()) + " -g " +
                     std::to_string(c["guidance_scale"].get<double>()) + " -W " +
                     std::to_string(c["width"].get<int>()) + " -H " +
                     std::to_string(c["height"].get<int>()) + " --control-scale " +
                     std::to_string(c["controlnet_conditioning_scale"].get<double>()) +
                     (controlnet.empty() ? "" : " --controlnet " + testing::shell_arg(controlnet)) +
                     " --control-image " + testing::shell_arg(ref / "control.png");
  if (c.contains("negative_prompt") && c["negative_prompt"].is_string())
    args += " -n " + testing::shell_arg(c["negative_prompt"].get<std::string>());
  if (fs::exists(ref / "mask.png"))
    args += " --init-image " + testing::shell_arg(ref / "init.png") + " --mask " +
            testing::shell_arg(ref / "mask.png");
  return args + " --noise " + testing::shell_arg(ref / "noise.npy") + " --dump " +
         testing::shell_arg(out / "dump") + " -o " + testing::shell_arg(out / "image.png") +
         " --no-cache --threads 2 -q";
}

// `got` against the first item of `want` (the control context is stored for the CFG batch).
void expect_close(const fs::path& got, const fs::path& want, double tolerance) {
  ASSERT_TRUE(fs::exists(got)) << got;
  const std::vector<float> g = read_npy(got).to_f32();
  std::vector<float> w = read_npy(want).to_f32();
  ASSERT_EQ(w.size() % g.size(), 0u) << got;
  w.resize(g.size());
  EXPECT_LE(testing::scaled_diff(g.data(), w.data(), int64_t(g.size())), tolerance) << got;
}

class ZImageControl : public ::testing::TestWithParam<const char*> {};

TEST_P(ZImageControl, MatchesTheOfficialPipelineAtEveryStage) {
  const std::string name = GetParam();
  const fs::path ref = case_dir(name);
  const fs::path out = testing::temp_dir("zimage-control-" + name);
  std::string log;
  ASSERT_EQ(testing::run_klein(command_for(ref, set_dir() / "controlnet", out), &log), 0) << log;
  const json info = json::parse(read_text_file(ref / "case.json"));
  const fs::path dump = out / "dump";
  constexpr double kTolerance = 1e-4;
  std::vector<std::string> files = {"prompt_embeds", "control_pixels", "control_latent_mean",
                                    "control_context"};
  if (fs::exists(ref / "mask.png"))
    files.insert(files.end(), {"masked_init_pixels", "masked_init_latent_mean"});
  if (info["guidance_scale"].get<double>() > 0) files.push_back("negative_prompt_embeds");
  for (const std::string& f : files) expect_close(dump / (f + ".npy"), ref / (f + ".npy"), kTolerance);
  const int steps = info["steps"].get<int>();
  for (int i = 0; i < steps; ++i) {
    const std::string p = "step" + std::to_string(i) + "_";
    for (const char* part : {"latents_in", "velocity", "latents_out"})
      expect_close(dump / (p + part + ".npy"), ref / (p + part + ".npy"), kTolerance);
  }
  for (const char* f : {"final_latents", "vae_input", "image_decoded", "image"})
    expect_close(dump / (std::string(f) + ".npy"), ref / (std::string(f) + ".npy"), kTolerance);
  testing::expect_png_matches(out / "image.png", ref / "image.png", info["width"].get<int>(),
                              info["height"].get<int>());
}

INSTANTIATE_TEST_SUITE_P(OfficialRuns, ZImageControl,
                         ::testing::Values("controlnet_c075_h64_w96", "controlnet_c100_cfg_h96_w64",
                                           "controlnet_inpaint_h80_w64"),
                         [](const auto& info) { return std::string(info.param); });

// The original single file (its places from the 2.1 release's rule) makes the directory's image,
// bit for bit; without -W/-H the output takes the control image's size.
TEST(ZImageControlFiles, TheSingleFileMakesTheDirectorysImage) {
  const fs::path ref = case_dir("controlnet_c075_h64_w96");
  const fs::path dir = testing::temp_dir("zimage-control-single");
  fs::create_directories(dir / "a");
  fs::create_directories(dir / "b");
  std::string log;
  ASSERT_EQ(testing::run_klein(command_for(ref, set_dir() / "controlnet", dir / "a"), &log), 0)
      << log;
  const fs::path single =
      set_dir() / "controlnet_original" / "Z-Image-Turbo-Fun-Controlnet-Union-2.1.safetensors";
  ASSERT_EQ(testing::run_klein(command_for(ref, single, dir / "b"), &log), 0) << log;
  EXPECT_EQ(read_npy(dir / "a" / "dump" / "image.npy").to_f32(),
            read_npy(dir / "b" / "dump" / "image.npy").to_f32());
  ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(set_dir() / "model") +
                                   " -p x -s 1 --seed 1 --no-cache -q --controlnet " +
                                   testing::shell_arg(single) + " --control-image " +
                                   testing::shell_arg(ref / "control.png") + " -o " +
                                   testing::shell_arg(dir / "sized.png"),
                               &log),
            0)
      << log;
  const Image sized = load_image(dir / "sized.png");
  EXPECT_EQ(sized.width, 96);
  EXPECT_EQ(sized.height, 64);
}

// `klein control canny` writes OpenCV's edges (tests/data/canny), and --control-preprocess canny
// makes the image that the edge map given as the control image makes.
TEST(ZImageControlFiles, CannyEdgesAsACommandAndOnTheFly) {
  const fs::path canny = testing::kSource / "tests" / "data" / "canny";
  const fs::path dir = testing::temp_dir("zimage-control-canny");
  std::string log;
  ASSERT_EQ(testing::run_klein("control canny " + testing::shell_arg(canny / "shapes_96x64.png") +
                                   " -o " + testing::shell_arg(dir / "edges.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(dir / "edges.png").rgb,
            load_image(canny / "shapes_96x64_canny_100_200.png").rgb);
  ASSERT_EQ(testing::run_klein("control canny --low 50 --high 150 " +
                                   testing::shell_arg(canny / "shapes_96x64.png") + " -o " +
                                   testing::shell_arg(dir / "edges50.png"),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(dir / "edges50.png").rgb,
            load_image(canny / "shapes_96x64_canny_50_150.png").rgb);
  EXPECT_NE(testing::run_klein("control canny " + testing::shell_arg(canny / "shapes_96x64.png") +
                                   " -o " + testing::shell_arg(dir / "edges.txt"),
                               &log),
            0);
  EXPECT_NE(log.find("expected a .png"), std::string::npos) << log;

  auto generate = [&](const std::string& control, const std::string& extra, const fs::path& out) {
    return testing::run_klein("generate -m " + testing::shell_arg(set_dir() / "model") +
                                  " -p x -s 2 --seed 3 --no-cache -q --controlnet " +
                                  testing::shell_arg(set_dir() / "controlnet") +
                                  " --control-image " + testing::shell_arg(control) + extra +
                                  " -o " + testing::shell_arg(out),
                              &log);
  };
  ASSERT_EQ(generate(dir / "edges.png", "", dir / "given.png"), 0) << log;
  ASSERT_EQ(generate(canny / "shapes_96x64.png", " --control-preprocess canny", dir / "fly.png"), 0)
      << log;
  ASSERT_EQ(generate(canny / "shapes_96x64.png", "", dir / "raw.png"), 0) << log;
  EXPECT_EQ(load_image(dir / "given.png").rgb, load_image(dir / "fly.png").rgb);
  EXPECT_NE(load_image(dir / "raw.png").rgb, load_image(dir / "fly.png").rgb);
  EXPECT_NE(generate(canny / "shapes_96x64.png", " --control-preprocess sobel", dir / "bad.png"),
            0);
  EXPECT_NE(log.find("--control-preprocess: expected canny"), std::string::npos) << log;
}

// The memory plan counts the control model: its weights and streams in the denoising phase.
TEST(ZImageControlFiles, TheMemoryPlanCountsTheControlModel) {
  const fs::path ref = case_dir("controlnet_c075_h64_w96");
  auto denoise_line = [&](const std::string& extra) {
    std::string log;
    EXPECT_EQ(testing::run_klein("generate -m " + testing::shell_arg(set_dir() / "model") +
                                     " -p x -s 2 -W 96 -H 64 --dry-run" + extra,
                                 &log),
              0)
        << log;
    const size_t at = log.find("  denoise        weights");
    EXPECT_NE(at, std::string::npos) << log;
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  const std::string plain = denoise_line("");
  const std::string control =
      denoise_line(" --controlnet " + testing::shell_arg(set_dir() / "controlnet") +
                   " --control-image " + testing::shell_arg(ref / "control.png"));
  // The tiny control model is 2.3 MB: 2 MiB more weights, resident and paged.
  EXPECT_NE(plain.find("weights 2 MiB paged / 4 MiB resident"), std::string::npos) << plain;
  EXPECT_NE(control.find("weights 4 MiB paged / 6 MiB resident"), std::string::npos) << control;
}

// `klein convert --controlnet` stores the control model beside the model: inspect shows it, a
// generation with a control image and no --controlnet takes it (the kept types: the directory's
// image bit for bit; Q8: its control blocks quantized by the policy, the image close to the
// official one), a container source carries it over, and a family without control models
// refuses it before writing anything.
TEST(ZImageControlFiles, AContainerHoldsTheControlModel) {
  const fs::path ref = case_dir("controlnet_c075_h64_w96");
  const fs::path dir = testing::temp_dir("zimage-control-container");
  std::string log;
  auto convert = [&](const fs::path& source, const std::string& args, const fs::path& out) {
    return testing::run_klein("convert -m " + testing::shell_arg(source) + args + " -q -o " +
                                  testing::shell_arg(out),
                              &log);
  };
  const std::string net = " --controlnet " + testing::shell_arg(set_dir() / "controlnet");
  ASSERT_EQ(convert(set_dir() / "model", net + " -t keep", dir / "keep.klein"), 0) << log;
  ASSERT_EQ(convert(set_dir() / "model", net + " -t q8", dir / "q8.klein"), 0) << log;
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(dir / "keep.klein"), &log), 0) << log;
  EXPECT_NE(log.find("control model: yes (controlnet: Z-Image ControlNet Union 2.1: "),
            std::string::npos)
      << log;

  // The directory with --controlnet, the container without.
  for (const char* d : {"dir", "keep", "q8"}) fs::create_directories(dir / d);
  ASSERT_EQ(testing::run_klein(command_for(ref, set_dir() / "controlnet", dir / "dir"), &log), 0)
      << log;
  ASSERT_EQ(testing::run_klein(command_for(ref, {}, dir / "keep", dir / "keep.klein"), &log), 0)
      << log;
  EXPECT_EQ(read_npy(dir / "dir" / "dump" / "image.npy").to_f32(),
            read_npy(dir / "keep" / "dump" / "image.npy").to_f32());
  ASSERT_EQ(testing::run_klein(command_for(ref, {}, dir / "q8", dir / "q8.klein"), &log), 0) << log;
  // Measured 0.045 of max|ref| (0.036 with the same Q8 transformer and the control model
  // unquantized): the tiny random network's Q8 error, not the control model's absence.
  expect_close(dir / "q8" / "dump" / "final_latents.npy", ref / "final_latents.npy", 6e-2);
  EXPECT_NE(read_npy(dir / "q8" / "dump" / "image.npy").to_f32(),
            read_npy(dir / "keep" / "dump" / "image.npy").to_f32());
  // The policy: the control blocks' projections take the type, the embedder stays a float.
  ASSERT_EQ(testing::run_klein("inspect --json " + testing::shell_arg(dir / "q8.klein"), &log), 0)
      << log;
  const json q8 = json::parse(log);
  std::map<std::string, std::string> types;
  for (const json& t : q8["tensors"]) types[t["name"]] = t["type"];
  EXPECT_EQ(types["controlnet.control_layers.0.attention.to_q.weight"], "q8");
  EXPECT_EQ(types["controlnet.control_noise_refiner.0.after_proj.weight"], "q8");
  EXPECT_EQ(types["controlnet.control_all_x_embedder.2-1.weight"], "bf16");
  EXPECT_EQ(types["controlnet.control_layers.0.adaLN_modulation.0.weight"], "bf16");

  // Carried over from a container source; a new one replaces it.
  ASSERT_EQ(convert(dir / "q8.klein", " -t q4", dir / "q4.klein"), 0) << log;
  ASSERT_EQ(testing::run_klein("inspect " + testing::shell_arg(dir / "q4.klein"), &log), 0) << log;
  EXPECT_NE(log.find("control model: yes"), std::string::npos) << log;

  // Refused before anything is written: another family, a control model of another model.
  EXPECT_NE(convert(testing::tiny_model(), net + " -t q8", dir / "klein.klein"), 0);
  EXPECT_NE(log.find("FLUX.2-klein has no control model"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "klein.klein"));
  EXPECT_NE(convert(testing::zimage_model(), net + " -t q8", dir / "other.klein"), 0);
  EXPECT_NE(log.find("another model"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(dir / "other.klein"));
}

// A single .safetensors file of [1, 2] BF16 tensors of these names (the header, then 4 zero
// bytes each).
void write_tiny_safetensors(const fs::path& path, const std::vector<std::string>& names) {
  nlohmann::json header = nlohmann::json::object();
  for (size_t i = 0; i < names.size(); ++i)
    header[names[i]] = {{"dtype", "BF16"}, {"shape", {1, 2}}, {"data_offsets", {4 * i, 4 * i + 4}}};
  const std::string text = header.dump();
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[size_t(b)] = char((uint64_t(text.size()) >> (8 * b)) & 0xff);
  bytes += text + std::string(4 * names.size(), '\0');
  testing::write_text(path, bytes);
}

TEST(ZImageControlFiles, RefusesWhatCannotRunBeforeAnyWork) {
  const fs::path ref = case_dir("controlnet_inpaint_h80_w64");
  const fs::path dir = testing::temp_dir("zimage-control-refusals");
  // A single file whose block index does not fit any counter, and one of another model.
  write_tiny_safetensors(dir / "huge-index.safetensors",
                         {"control_all_x_embedder.2-1.weight",
                          "control_layers.99999999999999999999.after_proj.weight"});
  write_tiny_safetensors(dir / "other.safetensors", {"double_blocks.0.img_attn.qkv.weight"});
  const std::string control = " --control-image " + testing::shell_arg(ref / "control.png");
  const std::string net = " --controlnet " + testing::shell_arg(set_dir() / "controlnet");
  const std::string init = " --init-image " + testing::shell_arg(ref / "init.png");
  const std::string model = testing::shell_arg(set_dir() / "model");
  struct Refusal {
    std::string model, args, expected;
  };
  for (const Refusal& r : std::vector<Refusal>{
           {model, control, "--control-image: no control model"},
           {model, control + " --controlnet " + testing::shell_arg(dir / "huge-index.safetensors"),
            "not a Z-Image control model"},
           {model, control + " --controlnet " + testing::shell_arg(dir / "other.safetensors"),
            "not a Z-Image control model"},
           {model, net, "--controlnet needs --control-image"},
           {model, " --control-scale 0.5", "--control-scale needs --control-image"},
           {model, net + control + init, "--control-image with --init-image needs --mask"},
           {model, net + control + " --strength 0.5", "--strength: the ControlNet pipelines"},
           {model, " --controlnet " + testing::shell_arg(ref / "init.png") + control,
            "expected a diffusers directory or the original .safetensors"},
           // The tiny control model against another Z-Image (dim 256 against its 128).
           {testing::shell_arg(testing::zimage_model()), net + control, "another model"},
           {testing::shell_arg(testing::tiny_model()), net + control, "has no control model"}})
    testing::expect_refused_before_work(
        "generate -m " + r.model + " -p x -s 2 --no-cache" + r.args, r.expected, dir / "out.png");
}

}  // namespace
}  // namespace zimage_control_test
}  // namespace klein
