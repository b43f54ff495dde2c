// The C library: errors, cancellation, and the same pixels and metadata as `klein generate`;
// then an installed tree: examples/c/generate.c built with pkg-config (shared and static) and
// with find_package(klein), each making the CLI's pixels.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "formats/image/image.h"
#include "klein/klein.h"
#include "support/cli_image.h"
#include "support/build_tree.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrompt = "a small red cube";

// `klein generate` with the parameters the library is given below.
Image cli_image(const fs::path& out, uint64_t seed, int width, int height, int steps) {
  return testing::cli_generate(testing::tiny_model(), kPrompt,
                               "--seed " + std::to_string(seed) + " -W " + std::to_string(width) +
                                   " -H " + std::to_string(height) + " -s " + std::to_string(steps),
                               out);
}

struct Opened {
  klein_model* model = nullptr;
  klein_session* session = nullptr;
  explicit Opened(const fs::path& path = testing::tiny_model()) {
    char* error = nullptr;
    EXPECT_EQ(klein_model_open(path.c_str(), nullptr, &model, &error), KLEIN_OK)
        << (error ? error : "");
    klein_string_free(error);
    klein_session_options o;
    klein_session_options_init(&o);
    o.threads = 2;
    EXPECT_EQ(klein_session_new(model, &o, &session, &error), KLEIN_OK) << (error ? error : "");
    klein_string_free(error);
  }
  ~Opened() {
    klein_session_free(session);
    klein_model_free(model);
  }
};

klein_generate_params params(uint64_t seed, int width, int height, int steps) {
  klein_generate_params p;
  klein_generate_params_init(&p);
  p.prompt = kPrompt;
  p.seed = seed;
  p.has_seed = 1;
  p.width = width;
  p.height = height;
  p.steps = steps;
  return p;
}

TEST(CApi, ErrorsNameWhatWasWrong) {
  EXPECT_STRNE(klein_version(), "");
  klein_model* model = reinterpret_cast<klein_model*>(1);
  char* error = nullptr;
  EXPECT_EQ(klein_model_open("/nonexistent/model", nullptr, &model, &error), KLEIN_ERROR);
  EXPECT_EQ(model, nullptr);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(std::string(error).find("/nonexistent/model"), std::string::npos) << error;
  klein_string_free(error);
  EXPECT_EQ(klein_model_open("x", nullptr, nullptr, nullptr), KLEIN_ERROR_ARGUMENT);

  Opened m;
  klein_image* image = nullptr;
  klein_generate_params p = params(1, 8, 64, 2);
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("params.width"), std::string::npos)
      << klein_session_error(m.session);
  p = params(1, 64, 64, 2);
  p.prompt = nullptr;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("prompt"), std::string::npos);
  EXPECT_EQ(image, nullptr);
  EXPECT_EQ(klein_generate(m.session, nullptr, &image), KLEIN_ERROR_ARGUMENT);
}

TEST(CApi, SamePixelsAndMetadataAsTheCli) {
  const fs::path out = testing::temp_dir("capi-pixels");
  Opened m;
  const klein_generate_params p = params(5, 64, 48, 3);
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  ASSERT_EQ(image->width, 64);
  ASSERT_EQ(image->height, 48);
  EXPECT_EQ(image->seed, 5u);
  EXPECT_EQ(image->steps, 3);
  const Image cli = cli_image(out / "cli.png", 5, 64, 48, 3);
  ASSERT_EQ(cli.rgb.size(), size_t(64 * 48 * 3));
  EXPECT_EQ(0, std::memcmp(cli.rgb.data(), image->pixels, cli.rgb.size()));
  char* error = nullptr;
  ASSERT_EQ(klein_image_save(image, (out / "api.png").c_str(), &error), KLEIN_OK) << error;
  EXPECT_EQ(read_image_metadata(out / "api.png"), read_image_metadata(out / "cli.png"));
  klein_image_free(image);
}

// "" is a prompt (the empty one, as the official pipelines take it): the image `klein generate
// -p ""` makes, not the image of another prompt; NULL stays refused (ErrorsNameWhatWasWrong).
TEST(CApi, EmptyPromptMakesTheCliImage) {
  const fs::path out = testing::temp_dir("capi-empty-prompt");
  Opened m;
  klein_generate_params p = params(5, 64, 48, 2);
  p.prompt = "";
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  const Image cli =
      testing::cli_generate(testing::tiny_model(), "", "--seed 5 -W 64 -H 48 -s 2", out / "cli.png");
  EXPECT_TRUE(testing::same_pixels(cli, image->pixels, image->width, image->height));
  EXPECT_NE(cli.rgb, cli_image(out / "prompt.png", 5, 64, 48, 2).rgb);
  EXPECT_NE(std::string(image->metadata).find("\"prompt\":\"\""), std::string::npos)
      << image->metadata;
  char* error = nullptr;
  ASSERT_EQ(klein_image_save(image, (out / "api.png").c_str(), &error), KLEIN_OK) << error;
  EXPECT_EQ(read_image_metadata(out / "api.png"), read_image_metadata(out / "cli.png"));
  klein_image_free(image);
}

// A batch: image i is the image klein_generate makes with seed + i; bad counts are refused
// and leave the array alone.
TEST(CApi, BatchImagesAreTheImagesMadeOneAtATime) {
  Opened m;
  const klein_generate_params p = params(11, 64, 48, 2);
  klein_image* images[3] = {nullptr, nullptr, nullptr};
  ASSERT_EQ(klein_generate_batch(m.session, &p, 3, images), KLEIN_OK)
      << klein_session_error(m.session);
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(images[i], nullptr);
    EXPECT_EQ(images[i]->seed, uint64_t(11 + i));
    const klein_generate_params one = params(uint64_t(11 + i), 64, 48, 2);
    klein_image* alone = nullptr;
    ASSERT_EQ(klein_generate(m.session, &one, &alone), KLEIN_OK);
    ASSERT_EQ(alone->width, images[i]->width);
    ASSERT_EQ(alone->height, images[i]->height);
    EXPECT_EQ(0, std::memcmp(alone->pixels, images[i]->pixels, size_t(64 * 48 * 3))) << i;
    EXPECT_STREQ(alone->metadata, images[i]->metadata) << i;
    klein_image_free(alone);
  }
  EXPECT_NE(0, std::memcmp(images[0]->pixels, images[1]->pixels, size_t(64 * 48 * 3)));
  for (klein_image* image : images) klein_image_free(image);

  klein_image* untouched[1] = {nullptr};
  EXPECT_EQ(klein_generate_batch(m.session, &p, 0, untouched), KLEIN_ERROR_ARGUMENT);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("count"), std::string::npos);
  klein_generate_params bad = params(1, 8, 64, 2);
  EXPECT_EQ(klein_generate_batch(m.session, &bad, 1, untouched), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("params.width"), std::string::npos);
  EXPECT_EQ(untouched[0], nullptr);
}

// Inpainting through the library: the init image, mask and strength make the CLI's pixels
// (the CLI's are checked against the official pipeline in tests/e2e/editing_test.cpp).
TEST(CApi, InpaintingMakesTheCliPixels) {
  const fs::path out = testing::temp_dir("capi-inpaint");
  const fs::path dir = testing::tiny_dir().parent_path() / "klein-tiny-edit" / "vectors" /
                       "inpaint" / "inpaint_s06_h80_w64";
  const fs::path init = dir / "init.png", mask = dir / "mask.png";
  Opened m;
  klein_generate_params p = params(9, 0, 0, 4);
  p.init_image = init.c_str();
  p.mask = mask.c_str();
  p.strength = 0.6f;
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  EXPECT_EQ(image->width, 64);
  EXPECT_EQ(image->height, 80);
  EXPECT_NE(std::string(image->parameters).find("Denoising strength: 0.6,"), std::string::npos)
      << image->parameters;
  const Image cli = testing::cli_generate(
      testing::tiny_model(), kPrompt,
      "--seed 9 -s 4 --init-image " + init.string() + " --mask " + mask.string() + " --strength 0.6",
      out / "cli.png");
  EXPECT_TRUE(testing::same_pixels(cli, image->pixels, image->width, image->height));
  klein_image_free(image);

  p.strength = 1.5f;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("params.strength"),
            std::string::npos);
  p.strength = 0;
  p.init_image = nullptr;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("--mask needs --init-image"),
            std::string::npos)
      << klein_session_error(m.session);
}

// LoRAs through the library: the CLI's pixels with the same files and scales.
TEST(CApi, LorasMakeTheCliPixels) {
  const fs::path out = testing::temp_dir("capi-lora");
  const fs::path loras = testing::lora_fixtures();
  const std::string bfl = (loras / "bfl.safetensors").string();
  const std::string kohya = (loras / "kohya.safetensors").string();
  Opened m;
  klein_generate_params p = params(4, 64, 64, 4);
  const char* files[] = {bfl.c_str(), kohya.c_str()};
  const float scales[] = {1.0f, 0.7f};
  p.loras = files;
  p.lora_scales = scales;
  p.lora_count = 2;
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  const Image cli = testing::cli_generate(
      testing::tiny_model(), kPrompt,
      "--seed 4 -s 4 -W 64 -H 64 --lora " + bfl + " --lora " + kohya + ":0.7", out / "cli.png");
  EXPECT_TRUE(testing::same_pixels(cli, image->pixels, 64, 64));
  EXPECT_NE(std::string(image->parameters).find("LoRA: bfl:1 kohya:0.7"), std::string::npos)
      << image->parameters;
  klein_image_free(image);

  p.lora_count = 1;
  p.loras = nullptr;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("params.loras"), std::string::npos);
}

// A progress callback that returns non-zero stops the generation; the session is usable after.
TEST(CApi, ProgressCallbackCancels) {
  Opened m;
  klein_generate_params p = params(2, 64, 64, 4);
  int calls = 0;
  p.user_data = &calls;
  p.progress = [](const klein_progress* progress, void* user) -> int {
    ++*static_cast<int*>(user);
    return std::string(progress->phase) == "denoise" && progress->done == 1;
  };
  klein_image* image = nullptr;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR_CANCELLED);
  EXPECT_EQ(image, nullptr);
  EXPECT_STREQ(klein_session_error(m.session), "cancelled");
  EXPECT_GT(calls, 2);
  p.progress = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  klein_image_free(image);
}

// The preview callback sees every step at an eighth of the size, the same pictures the CLI's
// --preview writes, and cancels by returning non-zero.
// A Z-Image model through the library: CFG with its two options makes the CLI's pixels and
// metadata, and the step preview is one pixel per 8x8 of the image.
TEST(CApi, ZImageWithItsGuidanceOptionsMakesTheCliPixels) {
  const fs::path model = testing::tiny_dir().parent_path() / "zimage-tiny" / "model";
  const fs::path out = testing::temp_dir("capi-zimage");
  Opened m(model);
  klein_generate_params p = params(4, 64, 48, 3);
  p.guidance = 3;
  p.negative_prompt = "blurry";
  p.cfg_normalization = 1;
  p.cfg_truncation = 0.5f;
  int previews = 0;
  p.user_data = &previews;
  p.preview = [](const klein_preview* preview, void* user) -> int {
    EXPECT_EQ(preview->width, 8);
    EXPECT_EQ(preview->height, 6);
    ++*static_cast<int*>(user);
    return 0;
  };
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  EXPECT_EQ(previews, 3);
  const Image cli = testing::cli_generate(
      model, kPrompt,
      "--seed 4 -W 64 -H 48 -s 3 -g 3 -n blurry --cfg-normalization 1 --cfg-truncation 0.5",
      out / "cli.png");
  EXPECT_TRUE(testing::same_pixels(cli, image->pixels, 64, 48));
  const std::string metadata = image->metadata;
  EXPECT_NE(metadata.find("\"cfg_normalization\":1.0"), std::string::npos) << metadata;
  EXPECT_NE(metadata.find("\"cfg_truncation\":0.5"), std::string::npos) << metadata;
  klein_image_free(image);

  // Image-to-image (ZImageImg2ImgPipeline) at the init image's size, as the CLI makes it.
  const fs::path init = testing::tiny_dir().parent_path() / "zimage-control" / "vectors" / "e2e" /
                        "img2img_s060_h64_w96" / "init.png";
  p = params(4, 0, 0, 3);
  p.init_image = init.c_str();
  p.strength = 0.7f;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  EXPECT_EQ(image->width, 96);
  EXPECT_EQ(image->height, 64);
  EXPECT_TRUE(testing::same_pixels(
      testing::cli_generate(model, kPrompt,
                            "--seed 4 -s 3 --strength 0.7 --init-image " + testing::shell_arg(init),
                            out / "img2img.png"),
      image->pixels, 96, 64));
  klein_image_free(image);

  // The same options on a FLUX.2-klein model are refused by name.
  Opened klein_model;
  p = params(4, 64, 48, 1);
  p.cfg_truncation = 0.5f;
  EXPECT_EQ(klein_generate(klein_model.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(klein_model.session)).find("cfg-truncation"),
            std::string::npos);
}

// Z-Image's ControlNet through the library: the control model, image and scale make the CLI's
// pixels (the CLI's are checked against the official pipeline in
// tests/e2e/zimage_control_test.cpp); a control image without a control model is refused.
TEST(CApi, ZImageControlNetMakesTheCliPixels) {
  const fs::path set = testing::tiny_dir().parent_path() / "zimage-control";
  const fs::path controlnet = set / "controlnet";
  const fs::path control = set / "vectors" / "e2e" / "controlnet_c075_h64_w96" / "control.png";
  const fs::path out = testing::temp_dir("capi-zimage-control");
  Opened m(set / "model");
  klein_generate_params p = params(5, 0, 0, 3);
  p.controlnet = controlnet.c_str();
  p.control_image = control.c_str();
  p.control_scale = 0.9f;
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  EXPECT_EQ(image->width, 96);
  EXPECT_EQ(image->height, 64);
  EXPECT_TRUE(testing::same_pixels(
      testing::cli_generate(set / "model", kPrompt,
                            "--seed 5 -s 3 --control-scale 0.9 --controlnet " +
                                testing::shell_arg(controlnet) + " --control-image " +
                                testing::shell_arg(control),
                            out / "cli.png"),
      image->pixels, 96, 64));
  klein_image_free(image);
  p.controlnet = nullptr;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR);
  EXPECT_NE(std::string(klein_session_error(m.session)).find("--control-image: no control model"),
            std::string::npos)
      << klein_session_error(m.session);
}

// FLUX.2-dev (the tiny one in the official layout): the guidance scale goes to the model
// (embedded, one pass per step), as on the command line.
TEST(CApi, FluxDevWithItsEmbeddedGuidanceMakesTheCliPixels) {
  const fs::path model = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const fs::path out = testing::temp_dir("capi-dev");
  Opened m(model);
  klein_generate_params p = params(6, 64, 48, 2);
  p.guidance = 4;
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  const Image cli =
      testing::cli_generate(model, kPrompt, "--seed 6 -W 64 -H 48 -s 2 -g 4", out / "cli.png");
  EXPECT_TRUE(testing::same_pixels(cli, image->pixels, 64, 48));
  klein_image_free(image);
  // Another scale makes another image: the model was given it.
  p.guidance = 1.5f;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  EXPECT_NE(0, std::memcmp(cli.rgb.data(), image->pixels, cli.rgb.size()));
  klein_image_free(image);
}

TEST(CApi, PreviewCallbackSeesEveryStepAndCancels) {
  const fs::path out = testing::temp_dir("capi-preview");
  Opened m;
  klein_generate_params p = params(3, 64, 48, 3);
  struct Seen {
    std::vector<int> steps;
    std::vector<uint8_t> last;
    int cancel_at = 0;
  } seen;
  p.user_data = &seen;
  p.preview = [](const klein_preview* preview, void* user) -> int {
    auto& s = *static_cast<Seen*>(user);
    EXPECT_EQ(preview->width, 8);
    EXPECT_EQ(preview->height, 6);
    EXPECT_EQ(preview->steps, 3);
    s.steps.push_back(preview->step);
    s.last.assign(preview->pixels, preview->pixels + preview->width * preview->height * 3);
    return preview->step == s.cancel_at;
  };
  klein_image* image = nullptr;
  ASSERT_EQ(klein_generate(m.session, &p, &image), KLEIN_OK) << klein_session_error(m.session);
  klein_image_free(image);
  EXPECT_EQ(seen.steps, (std::vector<int>{1, 2, 3}));
  std::string log;
  ASSERT_EQ(testing::run_klein("generate -m " + testing::tiny_model().string() + " -p \"" +
                                   kPrompt + "\" --seed 3 -W 64 -H 48 -s 3 --no-cache -q " +
                                   "--preview " + (out / "preview.png").string() + " -o " +
                                   (out / "image.png").string(),
                               &log),
            0)
      << log;
  EXPECT_EQ(load_image(out / "preview.png").rgb, seen.last);

  seen.steps.clear();
  seen.cancel_at = 2;
  EXPECT_EQ(klein_generate(m.session, &p, &image), KLEIN_ERROR_CANCELLED);
  EXPECT_EQ(image, nullptr);
  EXPECT_EQ(seen.steps, (std::vector<int>{1, 2}));
}

// --- an installed tree ---------------------------------------------------------------------

int run(const std::string& command, std::string* output = nullptr) {
  const std::string full = command + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  const int status = ::pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

TEST(Install, ExampleBuildsAgainstTheInstalledLibraryAndMakesTheCliPixels) {
  // A program built without the sanitizer cannot load an instrumented library; the normal
  // build runs this test.
  if (testing::sanitized()) GTEST_SKIP() << "sanitizer build";
  const fs::path dir = testing::temp_dir("install");
  const fs::path prefix = dir / "prefix";
  const fs::path build = fs::path(testing::klein_binary()).parent_path();
  const fs::path example = fs::path(KLEIN_SOURCE_DIR) / "examples" / "c" / "generate.c";
  std::string log;
  ASSERT_EQ(run("cmake --install " + build.string() + " --prefix " + prefix.string(), &log), 0)
      << log;
  for (const char* file : {"lib/libklein.so", "lib/libklein.a", "include/klein/klein.h",
                           "lib/pkgconfig/klein.pc", "lib/cmake/klein/kleinConfig.cmake",
                           "bin/klein"})
    EXPECT_TRUE(fs::exists(prefix / file)) << file;

  const std::string pc = "PKG_CONFIG_PATH=" + (prefix / "lib" / "pkgconfig").string() + " ";
  const fs::path shared = dir / "generate-shared", stat = dir / "generate-static";
  ASSERT_EQ(run("cc " + example.string() + " $(" + pc + "pkg-config --cflags --libs klein) -o " +
                shared.string(), &log), 0) << log;
  ASSERT_EQ(run("cc " + example.string() + " $(" + pc + "pkg-config --cflags klein) " +
                (prefix / "lib" / "libklein.a").string() + " $(" + pc +
                "pkg-config --static --libs-only-l klein | sed 's/-lklein //') -o " + stat.string(),
                &log), 0) << log;
  ASSERT_EQ(run("cmake -S " + (fs::path(KLEIN_SOURCE_DIR) / "tests" / "api" / "consumer").string() +
                " -B " + (dir / "consumer").string() + " -DCMAKE_PREFIX_PATH=" + prefix.string() +
                " -DKLEIN_EXAMPLE=" + example.string() + " && cmake --build " +
                (dir / "consumer").string(), &log), 0) << log;

  const Image cli = cli_image(dir / "cli.png", 9, 48, 64, 2);
  const std::string args = " " + testing::tiny_model().string() + " \"" + kPrompt + "\" 9 48 64 2 ";
  const std::string env = "LD_LIBRARY_PATH=" + (prefix / "lib").string() + " ";
  for (const fs::path& program : {shared, stat, dir / "consumer" / "generate"}) {
    const fs::path png = dir / (program.filename().string() + ".png");
    ASSERT_EQ(run(env + program.string() + args + png.string(), &log), 0) << program << log;
    const Image img = load_image(png);
    EXPECT_EQ(img.rgb, cli.rgb) << program;
  }
  // The static program does not need the shared library.
  EXPECT_EQ(run("ldd " + stat.string() + " | grep -c libklein", &log), 1) << log;
}

}  // namespace
}  // namespace klein
