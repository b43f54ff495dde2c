// `klein serve` as a client sees it: the tiny model behind the OpenAI and A1111 APIs makes
// the CLI's pixels for the same parameters; bad requests, missing keys and a full queue get
// their status codes; SIGTERM stops it cleanly. Base64 against the RFC 4648 vectors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <string>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "formats/image/image.h"
#include "core/base64.h"
#include "server/serve_process.h"
#include "support/cli_image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(Base64, Rfc4648Vectors) {
  const std::vector<std::pair<std::string, std::string>> vectors = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded), plain);
  }
  EXPECT_EQ(base64_decode("Zm9v\nYmFy"), "foobar");  // line breaks are skipped
  EXPECT_EQ(base64_decode("Zg"), "f");               // padding may be missing
  std::string all;
  for (int i = 0; i < 256; ++i) all += char(i);
  EXPECT_EQ(base64_decode(base64_encode(all)), all);
  for (const char* bad : {"Zm9v!", "Z", "Zg==Zg==", "Zm9vY==="})
    EXPECT_EQ(base64_decode(bad), std::nullopt) << bad;
}

Image png_of(const std::string& b64) {
  const std::optional<std::string> bytes = base64_decode(b64);
  EXPECT_TRUE(bytes.has_value());
  const std::string text = bytes.value_or("");
  return decode_image(std::as_bytes(std::span(text.data(), text.size())), "reply");
}

// The seed a PNG's metadata names: the "klein" JSON's, which the "parameters" text repeats.
// The reply carries the provenance record the CLI writes too.
std::string metadata_seed(const std::string& png, const fs::path& file) {
  std::ofstream(file, std::ios::binary) << png;
  std::string seed, parameters, xmp;
  for (const auto& [key, value] : read_image_metadata(file)) {
    if (key == "klein") seed = std::to_string(json::parse(value)["seed"].get<uint64_t>());
    if (key == "parameters") parameters = value;
    if (key == kXmpKey) xmp = value;
  }
  EXPECT_NE(parameters.find(", Seed: " + seed + ","), std::string::npos) << parameters;
  EXPECT_NE(xmp.find("digitalsourcetype/trainedAlgorithmicMedia"), std::string::npos) << xmp;
  return seed;
}

// The CLI's image for the same request.
Image cli(const std::string& args, const fs::path& out) {
  std::string log;
  EXPECT_EQ(testing::run_klein("generate -m " + testing::tiny_model().string() + " -p \"" +
                                   kPrompt + "\" --no-cache -q " + args + " -o " + out.string(),
                               &log),
            0)
      << log;
  return load_image(out);
}

fs::path inpaint_case() {
  return testing::tiny_dir().parent_path() / "klein-tiny-edit" / "vectors" / "inpaint" /
         "inpaint_s06_h80_w64";
}

std::string file_b64(const fs::path& p) { return base64_encode(read_text_file(p)); }

TEST(Serve, OpenAiAndA1111RequestsMakeTheCliPixels) {
  const fs::path out = testing::temp_dir("serve-pixels");
  ServeProcess serve;
  httplib::Client c = serve.client();

  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  const json h = json::parse(health->body);
  EXPECT_EQ(h["status"], "ok");
  EXPECT_EQ(h["queue"], 0);
  // What the studio page builds its form from: the distilled klein's four steps and no
  // guidance, the server's bounds, no API key.
  EXPECT_EQ(h["defaults"], json({{"steps", 4}, {"guidance", 1.0}})) << h;
  EXPECT_EQ(h["accepts"]["guidance"], false);
  EXPECT_EQ(h["accepts"]["negative_prompt"], false);
  EXPECT_EQ(h["accepts"]["mask"], true);
  EXPECT_EQ(h["limits"], json({{"max_side", 2048}, {"max_images", 4}, {"max_references", 10},
                               {"max_steps", 1000}}));
  EXPECT_EQ(h["auth"], false);

  // OpenAI generations: two images, seeds 5 and 6.
  const json gen = post_json(c, "/v1/images/generations",
                             {{"prompt", kPrompt}, {"size", "64x48"}, {"n", 2}, {"seed", 5},
                              {"steps", 3}, {"model", "ignored"}});
  ASSERT_EQ(gen["data"].size(), 2u);
  EXPECT_EQ(gen["data"][1]["seed"], 6);
  EXPECT_GT(gen["created"].get<int64_t>(), 0);
  EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb,
            cli("--seed 5 -W 64 -H 48 -s 3", out / "a.png").rgb);
  EXPECT_EQ(png_of(gen["data"][1]["b64_json"]).rgb,
            cli("--seed 6 -W 64 -H 48 -s 3", out / "b.png").rgb);

  // Seeds as numbers and as strings (JavaScript rounds numbers above 2^53): any 64-bit seed a
  // client gives is taken; a drawn one is below 2^32. The PNG's metadata says the same.
  const std::string max_seed = "18446744073709551615";
  const json largest = post_json(c, "/v1/images/generations",
                                 {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1},
                                  {"seed", std::numeric_limits<uint64_t>::max()}});
  ASSERT_EQ(largest["data"].size(), 1u);
  EXPECT_EQ(largest["data"][0]["seed"].get<uint64_t>(), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(largest["data"][0]["seed_str"], max_seed);
  EXPECT_EQ(metadata_seed(base64_decode(largest["data"][0]["b64_json"].get<std::string>())
                              .value_or(""),
                          out / "largest.png"),
            max_seed);
  const json drawn = post_json(c, "/v1/images/generations",
                               {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}});
  ASSERT_EQ(drawn["data"].size(), 1u);
  EXPECT_LT(drawn["data"][0]["seed"].get<uint64_t>(), uint64_t(1) << 32);
  EXPECT_EQ(drawn["data"][0]["seed_str"],
            std::to_string(drawn["data"][0]["seed"].get<uint64_t>()));

  // A1111 txt2img.
  const json t2i = post_json(c, "/sdapi/v1/txt2img",
                             {{"prompt", kPrompt}, {"width", 64}, {"height", 64}, {"steps", 2},
                              {"seed", 11}, {"cfg_scale", 1}, {"sampler_name", "Euler"}});
  ASSERT_EQ(t2i["images"].size(), 1u);
  EXPECT_EQ(png_of(t2i["images"][0]).rgb, cli("--seed 11 -W 64 -H 64 -s 2", out / "c.png").rgb);
  const json info = json::parse(t2i["info"].get<std::string>());
  EXPECT_EQ(info["seed"], 11);
  EXPECT_EQ(info["seed_str"], "11");
  EXPECT_EQ(info["all_seeds_str"], json::array({"11"}));
  EXPECT_EQ(t2i["parameters"]["prompt"], kPrompt);

  // A1111 img2img with a mask: inpainting.
  const fs::path dir = inpaint_case();
  const json i2i = post_json(
      c, "/sdapi/v1/img2img",
      {{"prompt", kPrompt}, {"steps", 4}, {"seed", 9}, {"denoising_strength", 0.6},
       {"init_images", {"data:image/png;base64," + file_b64(dir / "init.png")}},
       {"mask", file_b64(dir / "mask.png")}});
  ASSERT_EQ(i2i["images"].size(), 1u);
  EXPECT_EQ(png_of(i2i["images"][0]).rgb,
            cli("--seed 9 -s 4 --strength 0.6 --init-image " + (dir / "init.png").string() +
                    " --mask " + (dir / "mask.png").string(),
                out / "d.png")
                .rgb);
  EXPECT_EQ(json::parse(i2i["info"].get<std::string>())["denoising_strength"], 0.6);

  // OpenAI edits (multipart): a reference image.
  const fs::path ref = testing::tiny_vectors() / "inputs";
  fs::path ref_image;
  for (const auto& e : fs::directory_iterator(ref))
    if (e.path().extension() == ".png" && ref_image.empty()) ref_image = e.path();
  ASSERT_FALSE(ref_image.empty());
  httplib::MultipartFormDataItems form = {
      {"prompt", kPrompt, "", ""},
      {"image", read_text_file(ref_image), "ref.png", "image/png"},
      {"seed", "3", "", ""},
      {"steps", "2", "", ""},
      {"size", "64x64", "", ""},
      {"watermark", "false", "", ""}};  // a form's true/false reads as the JSON routes' boolean
  auto edit = c.Post("/v1/images/edits", form);
  ASSERT_TRUE(edit);
  ASSERT_EQ(edit->status, 200) << edit->body;
  const json e = json::parse(edit->body);
  EXPECT_EQ(png_of(e["data"][0]["b64_json"]).rgb,
            cli("--seed 3 -s 2 -W 64 -H 64 -r " + ref_image.string(), out / "e.png").rgb);

  EXPECT_EQ(serve.stop(), 0);
}

// LoRAs from --lora-dir by name in the prompt (A1111's <lora:NAME:SCALE>) make the CLI's
// pixels with --lora; unknown names are refused, and requests cannot name files.
TEST(Serve, LoraTagsInThePromptMakeTheCliPixels) {
  const fs::path out = testing::temp_dir("serve-lora");
  const fs::path dir = testing::lora_fixtures();
  ServeProcess serve("--lora-dir " + dir.string());
  httplib::Client c = serve.client();
  auto listed = c.Get("/sdapi/v1/loras");
  ASSERT_TRUE(listed);
  const json names = json::parse(listed->body);
  ASSERT_EQ(names.size(), 3u) << listed->body;
  EXPECT_EQ(names[0]["name"], "bfl");

  const json t2i = post_json(c, "/sdapi/v1/txt2img",
                             {{"prompt", std::string("<lora:bfl:0.5> ") + kPrompt + " <lora:kohya>"},
                              {"width", 64}, {"height", 64}, {"steps", 2}, {"seed", 3}});
  ASSERT_EQ(t2i["images"].size(), 1u);
  EXPECT_EQ(png_of(t2i["images"][0]).rgb,
            cli("--seed 3 -W 64 -H 64 -s 2 --lora " + (dir / "bfl.safetensors").string() +
                    ":0.5 --lora " + (dir / "kohya.safetensors").string(),
                out / "cli.png").rgb);
  EXPECT_NE(png_of(t2i["images"][0]).rgb, cli("--seed 3 -W 64 -H 64 -s 2", out / "plain.png").rgb);

  const json unknown = post_json(c, "/v1/images/generations",
                                 {{"prompt", std::string(kPrompt) + " <lora:../../etc/passwd>"},
                                  {"size", "64x64"}}, 400);
  EXPECT_NE(unknown.dump().find("not a LoRA of this server (available: bfl, kohya, peft)"),
            std::string::npos) << unknown.dump();
  const json bad_scale = post_json(c, "/sdapi/v1/txt2img",
                                   {{"prompt", "<lora:bfl:much>"}, {"width", 64}, {"height", 64}},
                                   400);
  EXPECT_NE(bad_scale.dump().find("the scale must be a number"), std::string::npos);
}

// A Z-Image model served: the request's guidance options reach its pipeline, and the pixels
// are the CLI's for the same settings.
TEST(Serve, ZImageRequestsMakeTheCliPixels) {
  const fs::path model = testing::tiny_dir().parent_path() / "zimage-tiny" / "model";
  const fs::path out = testing::temp_dir("serve-zimage");
  ServeProcess serve("", model);
  httplib::Client c = serve.client();
  const json gen = post_json(c, "/v1/images/generations",
                             {{"prompt", kPrompt}, {"size", "48x32"}, {"seed", 9}, {"steps", 3},
                              {"guidance", 3}, {"negative_prompt", "blurry"},
                              {"cfg_normalization", 1}, {"cfg_truncation", 0.5}});
  ASSERT_EQ(gen["data"].size(), 1u);
  EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb,
            testing::cli_generate(model, kPrompt,
                                  "--seed 9 -W 48 -H 32 -s 3 -g 3 -n blurry "
                                  "--cfg-normalization 1 --cfg-truncation 0.5",
                                  out / "cli.png")
                .rgb);
  // Without the options the image differs: they took effect.
  const json plain = post_json(c, "/v1/images/generations",
                               {{"prompt", kPrompt}, {"size", "48x32"}, {"seed", 9}, {"steps", 3},
                                {"guidance", 3}, {"negative_prompt", "blurry"}});
  EXPECT_NE(png_of(plain["data"][0]["b64_json"]).rgb, png_of(gen["data"][0]["b64_json"]).rgb);
  // Step caching as the CLI's --cache: a threshold that skips every step after the first
  // gives the CLI's pixels for it, which differ from the uncached ones.
  const json cached = post_json(c, "/v1/images/generations",
                                {{"prompt", kPrompt}, {"size", "48x32"}, {"seed", 9}, {"steps", 3},
                                 {"guidance", 3}, {"negative_prompt", "blurry"},
                                 {"cache", "first-block:1e9"}});
  const Image cached_png = png_of(cached["data"][0]["b64_json"]);
  EXPECT_EQ(cached_png.rgb, testing::cli_generate(model, kPrompt,
                                                  "--seed 9 -W 48 -H 32 -s 3 -g 3 -n blurry "
                                                  "--cache first-block:1e9",
                                                  out / "cli-cached.png")
                                .rgb);
  EXPECT_NE(cached_png.rgb, png_of(plain["data"][0]["b64_json"]).rgb);

  // Inpainting through A1111 img2img (ZImageInpaintPipeline), as the CLI makes it; /health
  // offers the init image.
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["accepts"]["init_image"], true) << health->body;
  EXPECT_EQ(json::parse(health->body)["accepts"]["cache"], true) << health->body;
  // Turbo: eight steps, guidance 0 (off), a negative prompt when guidance is given.
  EXPECT_EQ(json::parse(health->body)["defaults"], json({{"steps", 8}, {"guidance", 0.0}}));
  EXPECT_EQ(json::parse(health->body)["accepts"]["negative_prompt"], true);
  const fs::path dir =
      testing::tiny_dir().parent_path() / "zimage-control" / "vectors" / "e2e" / "inpaint_rect_h64_w80";
  const json i2i = post_json(
      c, "/sdapi/v1/img2img",
      {{"prompt", kPrompt}, {"steps", 3}, {"seed", 9}, {"denoising_strength", 0.7},
       {"init_images", {"data:image/png;base64," + file_b64(dir / "init.png")}},
       {"mask", file_b64(dir / "mask.png")}});
  ASSERT_EQ(i2i["images"].size(), 1u);
  EXPECT_EQ(png_of(i2i["images"][0]).rgb,
            testing::cli_generate(model, kPrompt,
                                  "--seed 9 -s 3 --strength 0.7 --init-image " +
                                      testing::shell_arg(dir / "init.png") + " --mask " +
                                      testing::shell_arg(dir / "mask.png"),
                                  out / "inpaint.png")
                .rgb);
}

// Polls a job (the 202 reply of POST /v1/jobs) until it is done or failed, for up to 30 s;
// its last state.
json wait_for_job(httplib::Client& c, const json& job) {
  json state = json::object();
  for (int i = 0; i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    auto r = c.Get(("/v1/jobs/" + job["id"].get<std::string>()).c_str());
    if (!r) break;
    state = json::parse(r->body);
    if (state.value("state", "") == "done" || state.value("state", "") == "failed") break;
  }
  return state;
}

// A Z-Image server with a control model: a request's control image and scale make the CLI's
// pixels (OpenAI generations and A1111 txt2img); /health offers the control image; a server
// without a control model refuses one by name, and one whose container holds it offers it.
TEST(Serve, ZImageControlImagesMakeTheCliPixels) {
  const fs::path set = testing::tiny_dir().parent_path() / "zimage-control";
  const fs::path control = set / "vectors" / "e2e" / "controlnet_c075_h64_w96" / "control.png";
  const fs::path out = testing::temp_dir("serve-zimage-control");
  const Image cli = testing::cli_generate(set / "model", kPrompt,
                                          "--seed 5 -s 3 -W 96 -H 64 --control-scale 0.9 "
                                          "--controlnet " + testing::shell_arg(set / "controlnet") +
                                              " --control-image " + testing::shell_arg(control),
                                          out / "cli.png");
  {
    ServeProcess serve("--controlnet " + testing::shell_arg(set / "controlnet"), set / "model");
    httplib::Client c = serve.client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(json::parse(health->body)["accepts"]["control_image"], true) << health->body;
    const json gen = post_json(c, "/v1/images/generations",
                               {{"prompt", kPrompt}, {"size", "96x64"}, {"seed", 5}, {"steps", 3},
                                {"control_image", file_b64(control)}, {"control_scale", 0.9}});
    ASSERT_EQ(gen["data"].size(), 1u);
    EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb, cli.rgb);
    const json t2i = post_json(c, "/sdapi/v1/txt2img",
                               {{"prompt", kPrompt}, {"width", 96}, {"height", 64}, {"seed", 5},
                                {"steps", 3}, {"control_image", file_b64(control)},
                                {"control_scale", 0.9}});
    ASSERT_EQ(t2i["images"].size(), 1u);
    EXPECT_EQ(png_of(t2i["images"][0]).rgb, cli.rgb);
    EXPECT_FALSE(t2i["parameters"].contains("control_image"));
    // A job keeps its control image until it has run.
    const json job = post_json(c, "/v1/jobs",
                               {{"prompt", kPrompt}, {"size", "96x64"}, {"seed", 5}, {"steps", 3},
                                {"control_image", file_b64(control)}, {"control_scale", 0.9}},
                               202);
    const json done = wait_for_job(c, job);
    ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 400);
    EXPECT_EQ(png_of(done["result"]["data"][0]["b64_json"]).rgb, cli.rgb);
  }
  ServeProcess plain("", set / "model");
  httplib::Client c = plain.client();
  const json refused = post_json(c, "/v1/images/generations",
                                 {{"prompt", kPrompt}, {"size", "96x64"},
                                  {"control_image", file_b64(control)}},
                                 400);
  EXPECT_NE(refused.dump().find("no control model"), std::string::npos) << refused.dump();
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["accepts"]["control_image"], false) << health->body;
  // A container that holds the control model (convert --controlnet, kept types): offered
  // without --controlnet, the same pixels.
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(set / "model") + " --controlnet " +
                                   testing::shell_arg(set / "controlnet") + " -t keep -q -o " +
                                   testing::shell_arg(out / "held.klein"),
                               &log),
            0)
      << log;
  ServeProcess held("", out / "held.klein");
  httplib::Client h = held.client();
  health = h.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["accepts"]["control_image"], true) << health->body;
  const json gen = post_json(h, "/v1/images/generations",
                             {{"prompt", kPrompt}, {"size", "96x64"}, {"seed", 5}, {"steps", 3},
                              {"control_image", file_b64(control)}, {"control_scale", 0.9}});
  ASSERT_EQ(gen["data"].size(), 1u);
  EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb, cli.rgb);
}

// A server with a tiny decoder: "decoder": "tiny" makes the CLI's --decoder tiny pixels, the
// default still the full decoder's; a job's last preview is the tiny decoder's picture at the
// image's size (the colour fit is one pixel per 8x8); /health names the file; a server without
// one refuses "decoder": "tiny" by name, and any server an unknown decoder; a server on a
// container that holds one offers it.
TEST(Serve, TinyDecoderRequestsMakeTheCliPixels) {
  const fs::path taef2 = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2" / "taef2_decoder.pth";
  const fs::path model = testing::tiny_model();
  const fs::path out = testing::temp_dir("serve-tiny-decoder");
  const std::string tiny = "--tiny-vae " + testing::shell_arg(taef2);
  const Image cli_tiny =
      testing::cli_generate(model, kPrompt, "--seed 4 -s 2 -W 64 -H 48 " + tiny + " --decoder tiny",
                            out / "tiny.png");
  const Image cli_full = testing::cli_generate(model, kPrompt, "--seed 4 -s 2 -W 64 -H 48",
                                               out / "full.png");
  ASSERT_NE(cli_tiny.rgb, cli_full.rgb);
  {
    ServeProcess serve(tiny, model);
    httplib::Client c = serve.client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    const json h = json::parse(health->body);
    EXPECT_EQ(h["tiny_decoder"]["enabled"], true) << health->body;
    EXPECT_EQ(h["tiny_decoder"]["file"], "taef2_decoder.pth") << health->body;
    const json body = {{"prompt", kPrompt}, {"size", "64x48"}, {"seed", 4}, {"steps", 2}};
    json with_tiny = body;
    with_tiny["decoder"] = "tiny";
    EXPECT_EQ(png_of(post_json(c, "/v1/images/generations", with_tiny)["data"][0]["b64_json"]).rgb,
              cli_tiny.rgb);
    EXPECT_EQ(png_of(post_json(c, "/v1/images/generations", body)["data"][0]["b64_json"]).rgb,
              cli_full.rgb);
    const json job = post_json(c, "/v1/jobs", with_tiny, 202);
    const json done = wait_for_job(c, job);
    ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 400);
    EXPECT_EQ(png_of(done["result"]["data"][0]["b64_json"]).rgb, cli_tiny.rgb);
    const Image preview = png_of(done["preview"]);
    EXPECT_EQ(preview.width, 64);
    EXPECT_EQ(preview.height, 48);
    json unknown = body;
    unknown["decoder"] = "small";
    EXPECT_NE(post_json(c, "/v1/images/generations", unknown, 400).dump().find("decoder\\\": expected"),
              std::string::npos);
  }
  ServeProcess plain("", model);
  httplib::Client c = plain.client();
  const json refused = post_json(c, "/v1/images/generations",
                                 {{"prompt", kPrompt}, {"size", "64x48"}, {"decoder", "tiny"}}, 400);
  EXPECT_NE(refused.dump().find("no tiny decoder"), std::string::npos) << refused.dump();
  // A container that holds the tiny decoder (convert --tiny-vae, kept types): offered without
  // --tiny-vae, the same pixels.
  std::string log;
  ASSERT_EQ(testing::run_klein("convert -m " + testing::shell_arg(model) + " " + tiny +
                                   " -t keep -q -o " + testing::shell_arg(out / "held.klein"),
                               &log),
            0)
      << log;
  ServeProcess held("", out / "held.klein");
  httplib::Client h = held.client();
  auto health = h.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(json::parse(health->body)["tiny_decoder"]["file"], "taef2_decoder.pth") << health->body;
  EXPECT_EQ(png_of(post_json(h, "/v1/images/generations",
                             {{"prompt", kPrompt}, {"size", "64x48"}, {"seed", 4}, {"steps", 2},
                              {"decoder", "tiny"}})["data"][0]["b64_json"])
                .rgb,
            cli_tiny.rgb);
}

// "upsample": true. With a remote model (--upsample-endpoint, here a stand-in on the loopback
// address) the prompt it returns makes the image and is the reply's revised_prompt, and a
// failing service falls back to the prompt as given; without one, the model's own text
// encoder writes what `klein upsample` writes; /health offers it.
TEST(Serve, UpsampleRequestsRewriteThePromptRemotelyOrLocally) {
  const std::string answer = "a small red cube on an oak table, soft studio light";
  httplib::Server chat;
  std::vector<std::string> asked;
  std::mutex asked_mutex;
  chat.Post("/v1/chat/completions", [&](const httplib::Request& q, httplib::Response& r) {
    {
      const std::lock_guard lock(asked_mutex);
      asked.push_back(json::parse(q.body)["messages"][1]["content"].get<std::string>());
    }
    r.set_content(json({{"choices", {{{"message", {{"content", answer}}}}}}}).dump(),
                  "application/json");
  });
  const int chat_port = chat.bind_to_any_port("127.0.0.1");
  std::thread chat_thread([&] { chat.listen_after_bind(); });
  while (!chat.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(chat_port) + "/v1";
  const fs::path model = testing::tiny_model();
  const fs::path out = testing::temp_dir("serve-upsample");
  const json body = {{"prompt", kPrompt}, {"size", "64x48"}, {"seed", 4}, {"steps", 2},
                     {"upsample", true}};
  {
    ServeProcess serve("--upsample-endpoint " + endpoint, model);
    httplib::Client c = serve.client();
    auto health = c.Get("/health");
    ASSERT_TRUE(health);
    EXPECT_EQ(json::parse(health->body)["accepts"]["upsample"], true) << health->body;
    const json gen = post_json(c, "/v1/images/generations", body);
    ASSERT_EQ(gen["data"].size(), 1u);
    EXPECT_EQ(gen["data"][0]["revised_prompt"], answer);
    EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb,
              testing::cli_generate(model, answer, "--seed 4 -s 2 -W 64 -H 48", out / "cli.png").rgb);
    {
      const std::lock_guard lock(asked_mutex);
      ASSERT_EQ(asked.size(), 1u);
      EXPECT_EQ(asked[0], kPrompt);
    }
    json plain = body;
    plain.erase("upsample");
    EXPECT_EQ(post_json(c, "/v1/images/generations", plain)["data"][0]["revised_prompt"], kPrompt);
    json wrong = body;
    wrong["upsample"] = "yes";
    EXPECT_NE(post_json(c, "/v1/images/generations", wrong, 400).dump().find("upsample"),
              std::string::npos);
    const std::lock_guard lock(asked_mutex);
    EXPECT_EQ(asked.size(), 1u);
  }
  chat.stop();
  chat_thread.join();
  {
    // The service gone: the prompt as given.
    ServeProcess serve("--upsample-endpoint " + endpoint + " --upsample-timeout 5", model);
    httplib::Client c = serve.client();
    EXPECT_EQ(post_json(c, "/v1/images/generations", body)["data"][0]["revised_prompt"], kPrompt);
  }
  // The model's own text encoder, as `klein upsample` runs it.
  std::string log;
  ASSERT_EQ(testing::run_klein("upsample -q -m " + testing::shell_arg(model) + " -p " +
                                   testing::shell_arg(kPrompt) + " --max-tokens 8",
                               &log),
            0)
      << log;
  while (!log.empty() && (log.back() == '\n' || log.back() == '\r')) log.pop_back();
  ServeProcess local("--upsample-max-tokens 8", model);
  httplib::Client c = local.client();
  EXPECT_EQ(post_json(c, "/v1/images/generations", body)["data"][0]["revised_prompt"], log);
}

// Editing in the JSON body of /v1/images/generations and /v1/jobs (what the web page sends):
// "references" as data URLs, "init_image" with "mask" and "strength": the CLI's pixels for the
// same files; bad combinations are refused by name.
TEST(Serve, JsonRequestsAndJobsCarryReferencesInitImageAndMask) {
  const fs::path model = testing::tiny_model();
  const fs::path out = testing::temp_dir("serve-json-edits");
  const fs::path ref = testing::tiny_vectors() / "inputs" / "ref0.png";
  const fs::path dir =
      testing::tiny_dir().parent_path() / "zimage-control" / "vectors" / "e2e" / "inpaint_rect_h64_w80";
  const fs::path init = dir / "init.png", mask = dir / "mask.png";
  const std::string data_url = "data:image/png;base64," + file_b64(ref);
  ServeProcess serve("", model);
  httplib::Client c = serve.client();
  const json edit = post_json(c, "/v1/images/generations",
                              {{"prompt", kPrompt}, {"size", "64x64"}, {"seed", 3}, {"steps", 2},
                               {"references", {data_url}}});
  EXPECT_EQ(png_of(edit["data"][0]["b64_json"]).rgb,
            testing::cli_generate(model, kPrompt, "--seed 3 -s 2 -W 64 -H 64 -r " +
                                                      testing::shell_arg(ref), out / "edit.png")
                .rgb);
  const json inpaint = {{"prompt", kPrompt}, {"seed", 3}, {"steps", 2},
                        {"init_image", file_b64(init)}, {"mask", file_b64(mask)}, {"strength", 0.7}};
  const json job = post_json(c, "/v1/jobs", inpaint, 202);
  const json done = wait_for_job(c, job);
  ASSERT_EQ(done["state"], "done") << done.dump().substr(0, 400);
  EXPECT_EQ(png_of(done["result"]["data"][0]["b64_json"]).rgb,
            testing::cli_generate(model, kPrompt, "--seed 3 -s 2 --strength 0.7 --init-image " +
                                                      testing::shell_arg(init) + " --mask " +
                                                      testing::shell_arg(mask), out / "inpaint.png")
                .rgb);
  for (const auto& [bad, says] : std::vector<std::pair<json, std::string>>{
           {{{"prompt", kPrompt}, {"mask", file_b64(mask)}}, "\\\"mask\\\": needs"},
           {{{"prompt", kPrompt}, {"strength", 0.5}}, "\\\"strength\\\": needs"},
           {{{"prompt", kPrompt}, {"references", "x"}}, "expected a list"},
           {{{"prompt", kPrompt}, {"references", {"not base64!"}}}, "references[0]"},
           {{{"prompt", kPrompt}, {"init_image", file_b64(init)}, {"strength", 2}}, "(0, 1]"}}) {
    EXPECT_NE(post_json(c, "/v1/jobs", bad, 400).dump().find(says), std::string::npos)
        << bad.dump().substr(0, 80) << " should say " << says;
  }
}

TEST(Serve, FluxDevRequestsMakeTheCliPixels) {
  const fs::path model = fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny" / "model";
  const fs::path out = testing::temp_dir("serve-dev");
  ServeProcess serve("", model);
  httplib::Client c = serve.client();
  // Its guidance is embedded in the model: a guidance value and no negative prompt.
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  const json h = json::parse(health->body);
  EXPECT_EQ(h["accepts"]["guidance"], true) << h;
  EXPECT_EQ(h["accepts"]["negative_prompt"], false) << h;
  EXPECT_EQ(h["defaults"]["guidance"], 4.0) << h;
  const json gen = post_json(c, "/v1/images/generations",
                             {{"prompt", kPrompt}, {"size", "48x32"}, {"seed", 9}, {"steps", 2},
                              {"guidance", 4}});
  ASSERT_EQ(gen["data"].size(), 1u);
  EXPECT_EQ(png_of(gen["data"][0]["b64_json"]).rgb,
            testing::cli_generate(model, kPrompt, "--seed 9 -W 48 -H 32 -s 2 -g 4", out / "cli.png")
                .rgb);
}

TEST(Serve, BadRequestsAreNamedAndKeysChecked) {
  ServeProcess serve("--api-key sesame --max-side 512");
  httplib::Client c = serve.client();
  auto health = c.Get("/health");  // open without the key
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["auth"], true);  // the page asks for the key
  EXPECT_EQ(json::parse(health->body)["limits"]["max_side"], 512);

  const json body = {{"prompt", kPrompt}, {"size", "64x64"}, {"steps", 1}};
  json reply = post_json(c, "/v1/images/generations", body, 401);
  EXPECT_EQ(reply["error"]["type"], "invalid_request_error");

  c.set_bearer_token_auth("sesame");
  auto refused = [&](const std::string& path, const json& request, const std::string& text) {
    const json r = post_json(c, path, request, 400);
    const std::string message = r.dump();
    EXPECT_NE(message.find(text), std::string::npos) << path << ": " << message;
  };
  refused("/v1/images/generations", {{"size", "64x64"}}, "\\\"prompt\\\": required");
  refused("/v1/images/generations", {{"prompt", "x"}, {"size", "64by64"}}, "\\\"size\\\"");
  refused("/v1/images/generations", {{"prompt", "x"}, {"size", "1024x1024"}}, "size (width)");
  refused("/v1/images/generations", {{"prompt", "x"}, {"response_format", "url"}},
          "b64_json");
  refused("/v1/images/generations", {{"prompt", "x"}, {"n", 9}}, "\\\"n\\\"");
  refused("/v1/images/generations", {{"prompt", "x"}, {"seed", "seven"}}, "\\\"seed\\\"");
  refused("/v1/images/generations", {{"prompt", "x"}, {"cfg_normalization", -1}},
          "cfg_normalization");
  refused("/v1/images/generations", {{"prompt", "x"}, {"cfg_truncation", "high"}},
          "cfg_truncation");
  refused("/v1/images/generations", {{"prompt", "x"}, {"cache", "first-block:many"}},
          "\\\"cache\\\": expected first-block:T");
  refused("/v1/images/generations", {{"prompt", "x"}, {"size", "64x64"}, {"steps", 1},
                                     {"cache", "first-block:0.1"}},
          "--cache: step caching runs with Z-Image so far");
  // Z-Image's options are refused by a FLUX.2-klein model, by name.
  refused("/v1/images/generations",
          {{"prompt", "x"}, {"size", "64x64"}, {"steps", 1}, {"cfg_truncation", 0.5}},
          "--cfg-normalization and --cfg-truncation are Z-Image's");
  refused("/sdapi/v1/img2img", {{"prompt", "x"}}, "init_images");
  refused("/sdapi/v1/img2img", {{"prompt", "x"}, {"init_images", {"@@@"}}}, "not valid base64");
  refused("/sdapi/v1/img2img", {{"prompt", "x"}, {"init_images", {base64_encode("not an image")}}},
          "init_images");
  auto res = c.Post("/v1/images/generations", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  // A1111 errors come in its own shape.
  const json a = post_json(c, "/sdapi/v1/txt2img", {{"width", 8}}, 400);
  EXPECT_EQ(a["error"], "Bad Request");
  EXPECT_NE(a["detail"].get<std::string>().find("width"), std::string::npos);
  EXPECT_EQ(serve.stop(), 0);
}

// A long job (1024x1024, 50 steps on the tiny model: seconds) in the background; its status.
std::future<int> slow_job(const ServeProcess& serve) {
  return std::async(std::launch::async, [&serve] {
    httplib::Client c = serve.client();
    auto r = c.Post("/v1/images/generations",
                    json{{"prompt", kPrompt}, {"size", "1024x1024"}, {"steps", 50}}.dump(),
                    "application/json");
    return r ? r->status : -1;
  });
}

// Polls /sdapi/v1/progress until the running job has a preview; the last reply.
json wait_for_preview(httplib::Client& c) {
  json p;
  for (int i = 0; i < 2400; ++i) {  // up to a minute (sanitizer builds are slow)
    auto r = c.Get("/sdapi/v1/progress");
    if (r && r->status == 200) {
      p = json::parse(r->body);
      if (!p["current_image"].is_null()) return p;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  ADD_FAILURE() << "no preview: " << p.dump();
  return p;
}

TEST(Serve, ProgressShowsThePreviewAndInterruptCancels) {
  ServeProcess serve;
  httplib::Client c = serve.client();
  const json idle = json::parse(c.Get("/sdapi/v1/progress")->body);
  EXPECT_EQ(idle["progress"], 0.0);
  EXPECT_TRUE(idle["current_image"].is_null());

  std::future<int> job = slow_job(serve);
  const json p = wait_for_preview(c);
  const Image preview = png_of(p["current_image"]);
  EXPECT_EQ(preview.width, 128);  // 1024 / 8
  EXPECT_EQ(preview.height, 128);
  EXPECT_EQ(p["state"]["sampling_steps"], 50);
  EXPECT_GE(p["state"]["sampling_step"].get<int>(), 1);
  EXPECT_GT(p["progress"].get<double>(), 0.0);
  EXPECT_LT(p["progress"].get<double>(), 1.0);

  const json stopped = post_json(c, "/sdapi/v1/interrupt", json::object());
  EXPECT_EQ(stopped["interrupted"], true);
  EXPECT_EQ(job.get(), 503);
  // The server goes on: the next request is served.
  const json next = post_json(c, "/v1/images/generations",
                              {{"prompt", kPrompt}, {"size", "64x64"}, {"steps", 1}});
  EXPECT_EQ(next["data"].size(), 1u);
  EXPECT_EQ(post_json(c, "/sdapi/v1/interrupt", json::object())["interrupted"], false);
  EXPECT_EQ(serve.stop(), 0);
}

TEST(Serve, AFullQueueGets429AndSigtermCancelsTheRunningJob) {
  ServeProcess serve("--max-queue 0");
  std::future<int> job = slow_job(serve);
  httplib::Client c = serve.client();
  wait_for_preview(c);  // running
  post_json(c, "/v1/images/generations", {{"prompt", kPrompt}, {"size", "64x64"}}, 429);
  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(serve.stop(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(20));
  const int status = job.get();
  EXPECT_TRUE(status == 503 || status == -1) << status;  // cancelled, or the socket closed
}

}  // namespace
}  // namespace klein
