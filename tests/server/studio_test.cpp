// The studio page of `klein serve` in a real browser (tests/server/browser.h), used as a person
// would: fields typed, files chosen in the picker, a mask painted with the mouse, buttons
// pressed. Each mode's image is the one the API makes for the request the page sent (the
// request read back from the browser's network log and sent again to
// /v1/images/generations), pixel for pixel; the gallery's "Use these settings" makes the same
// image again; every control fits a phone's and a desktop's width and has a label; the page
// asks nothing of any host but the server and writes no error to its console.
// KLEIN_STUDIO_SCREENSHOTS=DIR keeps a screenshot of each mode there (docs/studio-*.png).
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "core/files.h"
#include "formats/image/image.h"
#include "server/browser.h"
#include "server/serve_process.h"
#include "support/cli_image.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

Image image_of(const std::string& bytes) {
  return decode_image(std::as_bytes(std::span(bytes.data(), bytes.size())), "image");
}
Image png_of(const json& b64) {
  return image_of(base64_decode(b64.get<std::string>()).value_or(""));
}
// The bytes of a data URL.
std::string data_url_bytes(const std::string& url) {
  const size_t comma = url.find(',');
  EXPECT_TRUE(url.starts_with("data:") && comma != std::string::npos) << url.substr(0, 40);
  return base64_decode(url.substr(comma + 1)).value_or("");
}

// Script helpers the tests' expressions use: set a field as typing does (its input and change
// events fire), press a button, wait for the run to end.
constexpr const char* kHelpers = R"js(
window.t = {
  fill(id, value) {
    const e = document.getElementById(id);
    e.focus();
    e.value = value;
    e.dispatchEvent(new Event("input", { bubbles: true }));
    e.dispatchEvent(new Event("change", { bubbles: true }));
  },
  click(selector) { document.querySelector(selector).click(); },
  async until(test, seconds = 30) {
    for (let i = 0; i < seconds * 20 && !test(); ++i) await new Promise((done) => setTimeout(done, 50));
    return test();
  },
  // Presses Generate and waits for the run's end: its outcome, the status line, and the
  // newest `count` images of the gallery (each: seed, caption fields, the downloaded bytes).
  async run(count) {
    delete document.body.dataset.done;
    document.getElementById("go").click();
    await t.until(() => document.body.dataset.done, 120);
    const figures = [...document.querySelectorAll("#gallery figure.result")].slice(0, count);
    const images = [];
    for (const f of figures) {
      const link = f.querySelector("a.download");
      const bytes = new Uint8Array(await (await fetch(link.href)).arrayBuffer());
      let binary = "";
      for (const b of bytes) binary += String.fromCharCode(b);
      const text = (cls) => (f.querySelector("dd." + cls) || { textContent: "" }).textContent;
      images.push({ seed: text("seed"), size: text("size"), steps: text("steps"),
                    prompt: text("prompt"), watermark: text("watermark"), file: link.download,
                    png: btoa(binary), shown: f.querySelector("img").naturalWidth });
    }
    return { done: document.body.dataset.done,
             status: document.getElementById("status").textContent, images: images.reverse() };
  },
};
true)js";

// The page's JSON requests to POST /v1/jobs, in order, read from the browser's network log.
std::vector<json> job_requests(Browser& browser, const std::string& session) {
  std::vector<json> bodies;
  for (const json& e : browser.events()) {
    if (e.value("method", "") != "Network.requestWillBeSent") continue;
    const json& request = e["params"]["request"];
    if (request.value("method", "") != "POST" ||
        !request.value("url", "").ends_with("/v1/jobs"))
      continue;
    const json posted = browser.command(
        "Network.getRequestPostData", {{"requestId", e["params"]["requestId"]}}, session);
    bodies.push_back(json::parse(posted.value("postData", ""), nullptr, false));
  }
  return bodies;
}

// Every URL the page asked for: none may leave the server (data: and blob: URLs are the
// page's own images).
void expect_only_local_requests(Browser& browser, int port) {
  const std::string origin = "http://127.0.0.1:" + std::to_string(port) + "/";
  int asked = 0;
  for (const json& e : browser.events()) {
    if (e.value("method", "") != "Network.requestWillBeSent") continue;
    const std::string url = e["params"]["request"].value("url", "");
    ++asked;
    EXPECT_TRUE(url.starts_with(origin) || url.starts_with("data:") || url.starts_with("blob:"))
        << "the page asked for " << url;
  }
  EXPECT_GT(asked, 3);
}

// No uncaught exception, console.error or browser error (a failed load included) but the
// `refused` answers of the server the test asked for (the browser logs each 4xx).
void expect_no_console_errors(Browser& browser, int refused = 0) {
  for (const json& e : browser.events()) {
    if (e.value("method", "") == "Log.entryAdded" &&
        e["params"]["entry"].value("text", "").find("status of 400") != std::string::npos &&
        refused-- > 0)
      continue;
    const std::string method = e.value("method", "");
    EXPECT_NE(method, "Runtime.exceptionThrown") << e.dump().substr(0, 800);
    if (method == "Runtime.consoleAPICalled") {
      EXPECT_NE(e["params"].value("type", ""), "error") << e.dump().substr(0, 800);
    }
    if (method == "Log.entryAdded") {
      EXPECT_NE(e["params"]["entry"].value("level", ""), "error") << e.dump().substr(0, 800);
    }
  }
}

// The layout rules at the current viewport, over every mode the page offers: nothing wider
// than the window, every visible control inside it, every field labelled. Lists what breaks.
constexpr const char* kLayoutProblems = R"js((async () => {
  const problems = [];
  const width = document.documentElement.clientWidth;
  const modes = [...document.querySelectorAll("#modes button")].filter((b) => !b.hidden);
  for (const mode of modes) {
    mode.click();
    await new Promise((done) => setTimeout(done, 50));
    if (document.documentElement.scrollWidth > width)
      problems.push(mode.dataset.mode + ": the page is " + document.documentElement.scrollWidth +
                    " px wide in a " + width + " px window");
    for (const e of document.querySelectorAll("input, select, textarea, button, canvas, a, img")) {
      if (e.offsetParent === null || e.closest("[hidden]")) continue;
      const r = e.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.left < -0.5 || r.right > width + 0.5)
        problems.push(mode.dataset.mode + ": #" + (e.id || e.className || e.tagName) +
                      " spans " + r.left.toFixed(0) + " to " + r.right.toFixed(0) + " of " + width);
      if (["INPUT", "SELECT", "TEXTAREA"].includes(e.tagName) &&
          !(e.labels && e.labels.length) && !e.getAttribute("aria-label"))
        problems.push(mode.dataset.mode + ": #" + e.id + " has no label");
    }
  }
  document.getElementById("mode-txt2img").click();
  return problems;
})())js";

void keep_screenshot(Browser& browser, const std::string& session, const std::string& name) {
  const char* dir = std::getenv("KLEIN_STUDIO_SCREENSHOTS");
  if (!dir) return;
  std::ofstream(fs::path(dir) / ("studio-" + name + ".png"), std::ios::binary)
      << base64_decode(browser.screenshot(session)).value_or("");
}

void expect_layout(Browser& browser, const std::string& session, const std::string& name) {
  const json problems = browser.evaluate(session, kLayoutProblems);
  EXPECT_TRUE(problems.is_array() && problems.empty()) << name << ": " << problems.dump(1);
}

// The image the API makes for the request the page sent: the same body to the synchronous
// route.
std::vector<Image> api_images(httplib::Client& c, const json& body) {
  std::vector<Image> images;
  const json reply = post_json(c, "/v1/images/generations", body);
  for (const json& d : reply.value("data", json::array())) images.push_back(png_of(d["b64_json"]));
  return images;
}

// Presses Generate; the run's outcome, after checking that it went well.
json run(Browser& browser, const std::string& tab, int count) {
  const json shown = browser.evaluate(tab, "t.run(" + std::to_string(count) + ")");
  EXPECT_EQ(shown.value("done", ""), "ok") << shown.value("status", "");
  EXPECT_EQ(shown.value("images", json::array()).size(), size_t(count)) << shown.dump(1).substr(0, 800);
  return shown;
}

TEST(Studio, EveryModeMakesTheApisPixels) {
  ASSERT_TRUE(fs::exists("/usr/bin/chromium"))
      << "the browser test needs chromium (apt-get install chromium; scripts/test.sh does)";
  const fs::path out = testing::temp_dir("studio");
  const fs::path picture = testing::tiny_dir().parent_path() / "klein-tiny-edit" / "vectors" /
                           "inpaint" / "inpaint_s06_h80_w64" / "init.png";  // 64x80
  ServeProcess serve;
  httplib::Client c = serve.client();
  Browser browser(out / "profile");
  const std::string site = "http://127.0.0.1:" + std::to_string(serve.port()) + "/";
  const std::string max_seed = "18446744073709551615";  // 2^64 - 1: above a JavaScript number

  // A link that fills the form and runs it: the largest seed, shown and saved exactly, and the
  // CLI's pixels.
  const std::string tab = browser.open_watched(
      site + "?prompt=a%20small%20red%20cube&width=64&height=48&steps=3&seed=" + max_seed +
      "&run=1");
  ASSERT_EQ(browser.evaluate(tab, kHelpers), true);
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => document.body.dataset.done)"), "ok");
  {
    const json linked = browser.evaluate(tab, R"js((async () => {
      const f = document.querySelector("#gallery figure.result");
      const bytes = new Uint8Array(await (await fetch(f.querySelector("a.download").href)).arrayBuffer());
      let binary = "";
      for (const b of bytes) binary += String.fromCharCode(b);
      return { seed: f.querySelector("dd.seed").textContent, file: f.querySelector("a.download").download,
               png: btoa(binary) };
    })())js");
    EXPECT_EQ(linked["seed"], max_seed);
    EXPECT_EQ(linked["file"], "klein-" + max_seed + ".png");
    EXPECT_EQ(png_of(linked["png"]).rgb,
              testing::cli_generate(testing::tiny_model(), kPrompt,
                                    "--seed " + max_seed + " -W 64 -H 48 -s 3", out / "cli.png")
                  .rgb);
  }
  // A distilled klein: no negative prompt, guidance or CFG options; its four modes.
  EXPECT_EQ(browser.evaluate(tab, R"js([...document.querySelectorAll("#modes button")]
      .filter((b) => !b.hidden).map((b) => b.dataset.mode).join(" "))js"),
            "txt2img edit img2img inpaint");
  EXPECT_EQ(browser.evaluate(tab, R"js(["negative-row", "guidance-row"]
      .map((id) => document.getElementById(id).hidden).join(" "))js"),
            "true true");

  // Text to image, two images from a fixed seed: the seeds follow on, and each picture is the
  // API's for the request the page sent.
  browser.evaluate(tab, R"js(t.click("#mode-txt2img"); t.fill("prompt", "a small red cube");
      t.fill("width", "64"); t.fill("height", "48"); t.fill("steps", "3"); t.fill("seed", "7");
      t.fill("count", "2"); true)js");
  json shown = run(browser, tab, 2);
  std::vector<json> sent = job_requests(browser, tab);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1]["size"], "64x48");
  EXPECT_EQ(sent[1]["seed"], 7);
  EXPECT_EQ(sent[1]["n"], 2);
  std::vector<Image> api = api_images(c, sent[1]);
  ASSERT_EQ(api.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const json& image = shown["images"][i];
    EXPECT_EQ(image["seed"], std::to_string(7 + i));
    EXPECT_EQ(image["size"], "64x48");
    EXPECT_EQ(image["prompt"], kPrompt);
    EXPECT_TRUE(image.value("watermark", "").starts_with("no")) << image["watermark"];
    EXPECT_EQ(png_of(image["png"]).rgb, api[i].rgb) << "image " << i;
  }
  const Image seven = png_of(shown["images"][0]["png"]);

  // Edit: a reference from the file picker, a random seed, the size left to the reference.
  browser.evaluate(tab, R"js(t.click("#mode-edit"); t.fill("width", ""); t.fill("height", "");
      t.fill("seed", ""); t.fill("count", "1"); true)js");
  browser.choose_files(tab, "#refs", {picture});
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => document.querySelectorAll('#ref-list img').length === 1)"),
            true);
  shown = run(browser, tab, 1);
  sent = job_requests(browser, tab);
  ASSERT_EQ(sent.size(), 3u);
  ASSERT_EQ(sent[2]["references"].size(), 1u);
  EXPECT_EQ(data_url_bytes(sent[2]["references"][0]), read_text_file(picture));
  EXPECT_FALSE(sent[2].contains("seed"));
  const std::string drawn = shown["images"][0]["seed"];
  ASSERT_FALSE(drawn.empty());
  EXPECT_LT(std::stoull(drawn), uint64_t(1) << 32);
  EXPECT_EQ(shown["images"][0]["size"], "64x80");
  json replay = sent[2];
  replay["seed"] = std::stoull(drawn);
  api = api_images(c, replay);
  ASSERT_EQ(api.size(), 1u);
  EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, api[0].rgb);
  EXPECT_EQ(browser.evaluate(tab, R"js(t.click("#seed-last"); document.getElementById("seed").value)js"),
            drawn);

  // Image to image: the init image from the picker, the strength slider moved.
  browser.evaluate(tab, R"js(t.click("#mode-img2img"); t.fill("seed", "11"); t.fill("steps", "4");
      t.fill("strength", "0.6"); true)js");
  browser.choose_files(tab, "#init", {picture});
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => !document.getElementById('init-thumb').hidden)"), true);
  shown = run(browser, tab, 1);
  sent = job_requests(browser, tab);
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(data_url_bytes(sent[3]["init_image"]), read_text_file(picture));
  EXPECT_DOUBLE_EQ(sent[3]["strength"].get<double>(), 0.6);
  EXPECT_FALSE(sent[3].contains("mask"));
  api = api_images(c, sent[3]);
  ASSERT_EQ(api.size(), 1u);
  EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, api[0].rgb);
  EXPECT_EQ(shown["images"][0]["steps"], "4, strength 0.6");

  // Inpainting: the mask painted with the mouse over the top left of the init image (64x80,
  // shown larger or smaller: the page maps the pointer to image pixels).
  browser.evaluate(tab, R"js(t.click("#mode-inpaint"); t.fill("brush", "40");
      t.click("#watermark"); true)js");
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => document.getElementById('mask-canvas').width === 64)"), true);
  const json box = browser.evaluate(tab, R"js((() => {
    const c = document.getElementById("mask-canvas");
    c.scrollIntoView();
    const r = c.getBoundingClientRect();
    return { x: r.left, y: r.top, w: r.width, h: r.height };
  })())js");
  const double x = box["x"], y = box["y"], w = box["w"], h = box["h"];
  ASSERT_GT(w, 10);
  browser.drag(tab, {{x + 0.1 * w, y + 0.1 * h}, {x + 0.3 * w, y + 0.2 * h}, {x + 0.4 * w, y + 0.4 * h}});
  shown = run(browser, tab, 1);
  sent = job_requests(browser, tab);
  ASSERT_EQ(sent.size(), 5u);
  ASSERT_TRUE(sent[4].contains("mask"));
  const Image mask = image_of(data_url_bytes(sent[4]["mask"]));
  ASSERT_EQ(mask.width, 64);
  ASSERT_EQ(mask.height, 80);
  auto level = [&](double fx, double fy) {
    return int(mask.rgb[(size_t(fy * mask.height) * mask.width + size_t(fx * mask.width)) * 3]);
  };
  EXPECT_EQ(level(0.1, 0.1), 255);  // painted: repainted
  EXPECT_EQ(level(0.4, 0.4), 255);
  EXPECT_EQ(level(0.9, 0.9), 0);    // not painted: kept
  EXPECT_EQ(level(0.1, 0.9), 0);
  EXPECT_EQ(sent[3]["watermark"], true);
  EXPECT_EQ(sent[4]["watermark"], false);  // the switch turned off
  EXPECT_EQ(shown["images"][0]["watermark"], "no");
  api = api_images(c, sent[4]);
  ASSERT_EQ(api.size(), 1u);
  EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, api[0].rgb);

  // The gallery's "Use these settings" on the seed-7 image: the form as it was, and the image
  // again.
  const json form = browser.evaluate(tab, R"js((() => {
    const f = [...document.querySelectorAll("#gallery figure.result")]
        .find((f) => f.querySelector("dd.seed").textContent === "7");
    f.querySelector("button.use-settings").click();
    const v = (id) => document.getElementById(id).value;
    return { mode: document.querySelector("#modes [aria-selected=true]").dataset.mode,
             prompt: v("prompt"), width: v("width"), height: v("height"), steps: v("steps"),
             seed: v("seed"), count: v("count") };
  })())js");
  EXPECT_EQ(form, json({{"mode", "txt2img"}, {"prompt", kPrompt}, {"width", "64"}, {"height", "48"},
                        {"steps", "3"}, {"seed", "7"}, {"count", "1"}}));
  shown = run(browser, tab, 1);
  EXPECT_EQ(shown["images"][0]["seed"], "7");
  EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, seven.rgb);

  // An error is shown next to the field it names.
  const json refused = browser.evaluate(tab, R"js((async () => {
    t.fill("steps", "5000");
    const r = await t.run(0);
    const note = document.querySelector(".field-error");
    return { done: r.done, near: note ? note.parentElement.querySelector("input, textarea, select").id : "",
             text: note ? note.textContent : "" };
  })())js");
  EXPECT_EQ(refused["done"], "error");
  EXPECT_EQ(refused["near"], "steps");
  EXPECT_NE(refused.value("text", "").find("steps"), std::string::npos) << refused;
  browser.evaluate(tab, R"js(t.fill("steps", "3"); true)js");

  // Phone and desktop widths.
  browser.viewport(tab, 400, 860, true);
  expect_layout(browser, tab, "phone");
  browser.evaluate(tab, R"js(t.click("#mode-inpaint"); true)js");
  keep_screenshot(browser, tab, "phone-inpaint");

  browser.viewport(tab, 1280, 900, false);
  expect_layout(browser, tab, "desktop");
  for (const char* mode : {"txt2img", "edit", "img2img", "inpaint"}) {
    browser.evaluate(tab, std::string("t.click('#mode-") + mode + "'); true");
    keep_screenshot(browser, tab, mode);
  }

  expect_only_local_requests(browser, serve.port());
  expect_no_console_errors(browser, 1);  // the 400 of 5000 steps
  EXPECT_EQ(serve.stop(), 0);
}

// A server that needs an API key and upsamples through a remote model (a stand-in on the
// loopback address): the page asks for the key and keeps it in the tab's session only; a run
// waiting behind another shows its place in the queue, then its step preview as it forms, and
// Cancel stops it; an upsampled prompt is shown with its image, and "Use these settings" puts
// the prompt the image was made from in the form with upsampling off.
TEST(Studio, KeyQueuePreviewCancelAndUpsampling) {
  ASSERT_TRUE(fs::exists("/usr/bin/chromium"))
      << "the browser test needs chromium (apt-get install chromium; scripts/test.sh does)";
  const std::string answer = "a small red cube on an oak table, soft studio light";
  httplib::Server chat;
  chat.Post("/v1/chat/completions", [&](const httplib::Request&, httplib::Response& r) {
    r.set_content(json({{"choices", {{{"message", {{"content", answer}}}}}}}).dump(),
                  "application/json");
  });
  const int chat_port = chat.bind_to_any_port("127.0.0.1");
  std::thread chat_thread([&] { chat.listen_after_bind(); });
  while (!chat.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const fs::path out = testing::temp_dir("studio-queue");
  {
    ServeProcess serve("--api-key sesame --upsample-endpoint http://127.0.0.1:" +
                       std::to_string(chat_port) + "/v1");
    httplib::Client c = serve.client();
    c.set_bearer_token_auth("sesame");
    Browser browser(out / "profile");
    const std::string tab =
        browser.open_watched("http://127.0.0.1:" + std::to_string(serve.port()) + "/");
    ASSERT_EQ(browser.evaluate(tab, kHelpers), true);
    ASSERT_EQ(browser.evaluate(tab, "t.until(() => !!document.body.dataset.ready)"), true);
    EXPECT_EQ(browser.evaluate(tab, R"js(document.getElementById("key-row").hidden)js"), false);
    EXPECT_EQ(browser.evaluate(tab, R"js(document.getElementById("upsample-row").hidden)js"), false);

    // A long job of another client runs; the page's waits behind it, then runs and is
    // cancelled once its preview shows.
    const json slow = {{"prompt", kPrompt}, {"size", "1024x1024"}, {"steps", 100}};
    const std::string other = post_json(c, "/v1/jobs", slow, 202).value("id", "");
    browser.evaluate(tab, R"js(t.fill("key", "sesame"); t.fill("prompt", "a small red cube");
        t.fill("width", "1024"); t.fill("height", "1024"); t.fill("steps", "100");
        delete document.body.dataset.done; t.click("#go"); true)js");
    EXPECT_EQ(browser.evaluate(tab, R"js(t.until(() =>
        document.getElementById("status").textContent === "queued: 1 request ahead"))js"),
              true)
        << browser.evaluate(tab, R"js(document.getElementById("status").textContent)js");
    ASSERT_TRUE(c.Delete(("/v1/jobs/" + other).c_str()));
    EXPECT_EQ(browser.evaluate(tab, R"js(t.until(() => {
        const p = document.getElementById("preview");
        return !p.hidden && p.src.startsWith("data:image/png;base64,") && p.naturalWidth === 128;
      }))js"),
              true);
    EXPECT_TRUE(browser.evaluate(tab, R"js(document.getElementById("status").textContent)js")
                    .get<std::string>()
                    .starts_with("step "));
    browser.evaluate(tab, R"js(t.click("#stop"); true)js");
    const json cancelled = browser.evaluate(tab, R"js((async () => {
      await t.until(() => document.body.dataset.done);
      return { done: document.body.dataset.done, status: document.getElementById("status").textContent };
    })())js");
    EXPECT_EQ(cancelled["done"], "error");
    EXPECT_NE(cancelled.value("status", "").find("cancelled"), std::string::npos) << cancelled;

    // Upsampling: the rewritten prompt is shown with the image, which is the API's.
    browser.evaluate(tab, R"js(t.fill("width", "64"); t.fill("height", "48"); t.fill("steps", "2");
        t.fill("seed", "4"); t.click("#upsample"); true)js");
    const json shown = run(browser, tab, 1);
    const std::vector<json> sent = job_requests(browser, tab);
    ASSERT_EQ(sent.size(), 2u);
    EXPECT_EQ(sent[1]["upsample"], true);
    const json reply = post_json(c, "/v1/images/generations", sent[1]);
    ASSERT_EQ(reply["data"].size(), 1u);
    EXPECT_EQ(reply["data"][0]["revised_prompt"], answer);
    EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, png_of(reply["data"][0]["b64_json"]).rgb);
    EXPECT_EQ(shown["images"][0]["prompt"], kPrompt);
    EXPECT_EQ(browser.evaluate(tab, R"js(document.querySelector("#gallery figure.result dd.revised").textContent)js"),
              answer);
    const json form = browser.evaluate(tab, R"js((() => {
      t.click("#gallery figure.result button.use-settings");
      return { prompt: document.getElementById("prompt").value,
               upsample: document.getElementById("upsample").checked };
    })())js");
    EXPECT_EQ(form, json({{"prompt", answer}, {"upsample", false}}));

    // The key: in the tab's session storage, nowhere that outlives it.
    EXPECT_EQ(browser.evaluate(tab, R"js(sessionStorage.getItem("klein-key") + " " + localStorage.length)js"),
              "sesame 0");
    expect_only_local_requests(browser, serve.port());
    expect_no_console_errors(browser);
    EXPECT_EQ(serve.stop(), 0);
  }
  chat.stop();
  chat_thread.join();
}

// A Z-Image server with a control model: the negative prompt, guidance and its two CFG
// options are offered, and the control mode's image (a control image from the picker) is the
// API's.
TEST(Studio, ZImageOffersItsOptionsAndControlImages) {
  ASSERT_TRUE(fs::exists("/usr/bin/chromium"))
      << "the browser test needs chromium (apt-get install chromium; scripts/test.sh does)";
  const fs::path set = testing::tiny_dir().parent_path() / "zimage-control";
  const fs::path control = set / "vectors" / "e2e" / "controlnet_c075_h64_w96" / "control.png";
  const fs::path out = testing::temp_dir("studio-zimage");
  ServeProcess serve("--controlnet " + testing::shell_arg(set / "controlnet"), set / "model");
  httplib::Client c = serve.client();
  Browser browser(out / "profile");
  const std::string tab = browser.open_watched(
      "http://127.0.0.1:" + std::to_string(serve.port()) +
      "/?mode=control&prompt=a%20small%20red%20cube&negative=blurry&steps=3&seed=4"
      "&guidance=3&cfg_normalization=1&cfg_truncation=0.5");
  ASSERT_EQ(browser.evaluate(tab, kHelpers), true);
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => !!document.body.dataset.ready)"), true);
  EXPECT_EQ(browser.evaluate(tab, R"js([...document.querySelectorAll("#modes button")]
      .filter((b) => !b.hidden).map((b) => b.dataset.mode).join(" "))js"),
            "txt2img img2img inpaint control");
  EXPECT_EQ(browser.evaluate(tab, R"js([...document.querySelectorAll("#form input, #form textarea, #form select")]
      .filter((e) => e.offsetParent !== null && e.type !== "file").map((e) => e.id).join(" "))js"),
            "prompt upsample negative control_scale width height steps guidance cfg_normalization "
            "cfg_truncation cache count seed watermark");
  browser.choose_files(tab, "#control", {control});
  ASSERT_EQ(browser.evaluate(tab, "t.until(() => !document.getElementById('control-thumb').hidden)"), true);
  browser.evaluate(tab, R"js(t.fill("control_scale", "0.9"); true)js");
  const json shown = run(browser, tab, 1);
  const std::vector<json> sent = job_requests(browser, tab);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(data_url_bytes(sent[0]["control_image"]), read_text_file(control));
  EXPECT_FALSE(sent[0].contains("size"));  // the control image's
  EXPECT_EQ(sent[0]["negative_prompt"], "blurry");
  EXPECT_EQ(sent[0]["cfg_truncation"], 0.5);
  EXPECT_EQ(shown["images"][0]["size"], "96x64");
  const std::vector<Image> api = api_images(c, sent[0]);
  ASSERT_EQ(api.size(), 1u);
  EXPECT_EQ(png_of(shown["images"][0]["png"]).rgb, api[0].rgb);
  EXPECT_FALSE(sent[0].contains("cache"));  // left empty: off

  // The step cache (Z-Image has it; the control image refuses it): a text-to-image run with the
  // field set sends it as the API's "cache", and the gallery says how many steps it reused. The
  // threshold is one that no step of the tiny random model changes by, so every step after the
  // first reuses the first one's layers.
  browser.evaluate(tab, R"js(t.click("#mode-txt2img"); t.fill("width", "64"); t.fill("height", "64");
      t.fill("cache", "5"); true)js");
  const json cached = run(browser, tab, 1);
  const std::vector<json> sent_cached = job_requests(browser, tab);
  ASSERT_EQ(sent_cached.size(), 2u);
  EXPECT_EQ(sent_cached[1]["cache"], "first-block:5");
  const std::vector<Image> api_cached = api_images(c, sent_cached[1]);
  ASSERT_EQ(api_cached.size(), 1u);
  EXPECT_EQ(png_of(cached["images"][0]["png"]).rgb, api_cached[0].rgb);
  EXPECT_EQ(browser.evaluate(tab, R"js(document.querySelector("#gallery figure dd.cache").textContent)js"),
            "5: 2 of 3 steps reused");
  browser.viewport(tab, 400, 860, true);
  expect_layout(browser, tab, "phone");
  browser.viewport(tab, 1280, 900, false);
  browser.evaluate(tab, R"js(t.click("#mode-control"); true)js");
  keep_screenshot(browser, tab, "control");
  expect_only_local_requests(browser, serve.port());
  expect_no_console_errors(browser);
  EXPECT_EQ(serve.stop(), 0);
}

}  // namespace
}  // namespace klein
