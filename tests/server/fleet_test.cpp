// What a fleet of `klein serve` behind a load balancer and an autoscaler relies on: /metrics
// in the Prometheus text format, /health saying "loading" until the model is open, a request
// cancelled when its client leaves, and the asynchronous job API.
#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <future>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "formats/image/image.h"
#include "ops/compute.h"
#include "pipeline/pipeline.h"
#include "server/metrics.h"
#include "server/serve_process.h"
#include "server/server.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Labels = std::map<std::string, std::string>;

// --- a reader of the Prometheus text format (0.0.4) ---------------------------------------------

struct Sample {
  std::string name;
  Labels labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> types, helps;  // metric family -> type, help text

  // The value of the sample with exactly these labels; none when absent.
  std::optional<double> get(const std::string& name, const Labels& labels = {}) const {
    for (const Sample& s : samples)
      if (s.name == name && s.labels == labels) return s.value;
    return std::nullopt;
  }
};

// Every line is a "# HELP name text", a "# TYPE name type" or a sample
// `name{label="value",...} number`; a line that is none of them fails the test. Each sample
// must belong to a family whose TYPE came before it (a histogram's samples are its
// _bucket, _sum and _count), and every counter's name must end in _total.
Exposition parse_metrics(const std::string& text) {
  Exposition e;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    start = end + 1;
    if (line.empty()) continue;
    if (line.starts_with("# HELP ") || line.starts_with("# TYPE ")) {
      const size_t space = line.find(' ', 7);
      EXPECT_NE(space, std::string::npos) << line;
      const std::string family = line.substr(7, space - 7), rest = line.substr(space + 1);
      if (line[2] == 'H') {
        e.helps[family] = rest;
      } else {
        EXPECT_TRUE(rest == "counter" || rest == "gauge" || rest == "histogram") << line;
        EXPECT_TRUE(e.helps.count(family)) << "TYPE before HELP: " << line;
        if (rest == "counter") {
          EXPECT_TRUE(family.ends_with("_total")) << line;
        }
        e.types[family] = rest;
      }
      continue;
    }
    if (line[0] == '#') {
      ADD_FAILURE() << "a comment that is neither HELP nor TYPE: " << line;
      continue;
    }
    Sample s;
    size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    EXPECT_FALSE(s.name.empty()) << line;
    if (i != std::string::npos && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find("=\"", i);
        EXPECT_NE(eq, std::string::npos) << line;
        if (eq == std::string::npos) return e;
        const std::string key = line.substr(i, eq - i);
        std::string value;
        for (i = eq + 2; i < line.size() && line[i] != '"'; ++i) {
          if (line[i] == '\\' && i + 1 < line.size()) {
            ++i;
            value += line[i] == 'n' ? '\n' : line[i];
          } else {
            value += line[i];
          }
        }
        EXPECT_LT(i, line.size()) << "unterminated label value: " << line;
        s.labels[key] = value;
        ++i;  // the closing quote
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;  // '}'
    }
    EXPECT_TRUE(i < line.size() && line[i] == ' ') << line;
    const std::string number = line.substr(i + 1);
    char* stop = nullptr;
    s.value = std::strtod(number.c_str(), &stop);
    EXPECT_TRUE(!number.empty() && *stop == '\0') << "not a number: " << line;
    std::string family = s.name;
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!e.types.count(family) && family.ends_with(suffix))
        family = family.substr(0, family.size() - std::string(suffix).size());
    EXPECT_TRUE(e.types.count(family)) << "a sample without its TYPE: " << line;
    e.samples.push_back(s);
  }
  return e;
}

Exposition scrape(const ServeProcess& serve) {
  httplib::Client c("127.0.0.1", serve.port());
  auto r = c.Get("/metrics");
  EXPECT_TRUE(r);
  if (!r) return {};
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->get_header_value("Content-Type").starts_with("text/plain; version=0.0.4"));
  return parse_metrics(r->body);
}

TEST(ServerMetrics, RendersCountersGaugesAndACumulativeHistogram) {
  Metrics m;
  m.image_done("/v1/images/generations", 0.7);
  m.image_done("/v1/images/generations", 45);
  m.image_done("/sdapi/v1/txt2img", 5000);  // above every bound: only +Inf
  m.error("/v1/jobs", "cancelled");
  m.error("/v1/jobs", "cancelled");
  m.error("/sdapi/v1/txt2img", "bad_request");
  m.phase("denoise", 1.5);
  m.phase("denoise", 2.0);
  m.phase("a \"quoted\" \\ phase\n", 1);
  const Exposition e = parse_metrics(
      m.render({.queue = 3, .running = true, .ready = true, .jobs = 2, .peak_rss = 123456789}));
  EXPECT_EQ(e.get("klein_queue_depth"), 3);
  EXPECT_EQ(e.get("klein_running"), 1);
  EXPECT_EQ(e.get("klein_ready"), 1);
  EXPECT_EQ(e.get("klein_jobs"), 2);
  EXPECT_EQ(e.get("klein_peak_rss_bytes"), 123456789);
  EXPECT_EQ(e.types.at("klein_generation_seconds"), "histogram");
  EXPECT_EQ(e.get("klein_images_generated_total", {{"route", "/v1/images/generations"}}), 2);
  EXPECT_EQ(e.get("klein_images_generated_total", {{"route", "/sdapi/v1/txt2img"}}), 1);
  EXPECT_EQ(e.get("klein_errors_total", {{"route", "/v1/jobs"}, {"kind", "cancelled"}}), 2);
  EXPECT_EQ(e.get("klein_errors_total", {{"route", "/sdapi/v1/txt2img"}, {"kind", "bad_request"}}),
            1);
  EXPECT_EQ(e.get("klein_phase_seconds_total", {{"phase", "denoise"}}), 3.5);
  EXPECT_EQ(e.get("klein_phase_seconds_total", {{"phase", "a \"quoted\" \\ phase\n"}}), 1);
  // Cumulative buckets: 0.7 from 1 s on, 45 from 60 s on, 5000 in +Inf only.
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "0.5"}}), 0);
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "1"}}), 1);
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "30"}}), 1);
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "60"}}), 2);
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "1200"}}), 2);
  EXPECT_EQ(e.get("klein_generation_seconds_bucket", {{"le", "+Inf"}}), 3);
  EXPECT_EQ(e.get("klein_generation_seconds_count"), 3);
  EXPECT_EQ(e.get("klein_generation_seconds_sum"), 5045.7);
}

// /metrics of a running server, open without the API key: a generation adds an image, its
// time and its phases; a bad request and a missing key add errors of their kinds.
TEST(Serve, MetricsCountImagesErrorsAndPhases) {
  ServeProcess serve("--api-key sesame");
  const Exposition before = scrape(serve);
  EXPECT_EQ(before.get("klein_ready"), 1);
  EXPECT_EQ(before.get("klein_queue_depth"), 0);
  EXPECT_EQ(before.get("klein_running"), 0);
  EXPECT_EQ(before.get("klein_generation_seconds_count"), 0);
  EXPECT_EQ(before.get("klein_images_generated_total", {{"route", "/v1/images/generations"}}),
            std::nullopt);
  EXPECT_GT(before.get("klein_peak_rss_bytes").value_or(0), 1 << 20);

  httplib::Client c = serve.client();
  post_json(c, "/v1/images/generations", {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}},
            401);
  c.set_bearer_token_auth("sesame");
  const json made = post_json(c, "/v1/images/generations",
                              {{"prompt", kPrompt}, {"size", "32x32"}, {"n", 2}, {"steps", 2}});
  EXPECT_EQ(made["data"].size(), 2u);
  post_json(c, "/sdapi/v1/txt2img", {{"prompt", kPrompt}, {"width", 8}}, 400);

  const Exposition after = scrape(serve);
  const std::string route = "/v1/images/generations";
  EXPECT_EQ(after.get("klein_images_generated_total", {{"route", route}}), 2);
  EXPECT_EQ(after.get("klein_generation_seconds_count"), 2);
  EXPECT_GT(after.get("klein_generation_seconds_sum").value_or(0), 0);
  EXPECT_EQ(after.get("klein_generation_seconds_bucket", {{"le", "+Inf"}}), 2);
  EXPECT_EQ(after.get("klein_errors_total", {{"route", route}, {"kind", "unauthorized"}}), 1);
  EXPECT_EQ(
      after.get("klein_errors_total", {{"route", "/sdapi/v1/txt2img"}, {"kind", "bad_request"}}),
      1);
  for (const char* phase : {"text encoder", "denoise", "vae decode"})
    EXPECT_GT(after.get("klein_phase_seconds_total", {{"phase", phase}}).value_or(0), 0) << phase;
  EXPECT_GE(after.get("klein_peak_rss_bytes").value_or(0),
            before.get("klein_peak_rss_bytes").value_or(0));
  EXPECT_EQ(serve.stop(), 0);
}

// The library's server bound before its model is open: /health and the generation routes
// answer 503 until set_model(), then 200.
TEST(ServerLibrary, AnswersLoadingUntilTheModelIsSet) {
  Compute cx(2);
  ServerOptions options;
  options.port = 0;
  Server server(cx, options);
  const int port = server.bind();
  std::thread http([&] { server.run(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  auto health = c.Get("/health");
  for (int i = 0; i < 200 && !health; ++i) {  // until the listen loop runs
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    health = c.Get("/health");
  }
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  const json loading = json::parse(health->body);
  EXPECT_EQ(loading["status"], "loading");
  EXPECT_TRUE(loading["model"].is_null());
  EXPECT_EQ(loading["busy"], false);
  EXPECT_EQ(loading["queue"], 0);
  const json refused = post_json(c, "/v1/images/generations",
                                 {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}}, 503);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("still loading"), std::string::npos)
      << refused;
  post_json(c, "/v1/jobs", {{"prompt", kPrompt}}, 503);
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  const Exposition e = parse_metrics(metrics->body);
  EXPECT_EQ(e.get("klein_ready"), 0);
  EXPECT_EQ(
      e.get("klein_errors_total", {{"route", "/v1/images/generations"}, {"kind", "not_ready"}}), 1);

  Model model = Model::open({.model = testing::tiny_model()});
  server.set_model(model);
  health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  EXPECT_EQ(json::parse(health->body)["status"], "ok");
  EXPECT_EQ(json::parse(health->body)["model"], model.name);
  const json made = post_json(c, "/v1/images/generations",
                              {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}});
  EXPECT_EQ(made["data"].size(), 1u);
  server.stop();
  http.join();
}

// stop() before run() has started listening still ends run() (the CLI stops the server when
// its model fails to open, which may be before the listening thread got going).
TEST(ServerLibrary, StopBeforeRunEndsRun) {
  Compute cx(1);
  Server server(cx, ServerOptions{.port = 0});
  server.bind();
  server.stop();
  auto ran = std::async(std::launch::async, [&] { server.run(); });
  EXPECT_EQ(ran.wait_for(std::chrono::seconds(10)), std::future_status::ready);
}

// A model that cannot be opened: the process (which was already listening) exits non-zero
// and says why.
TEST(Serve, AModelThatFailsToOpenEndsTheProcessWithItsError) {
  const fs::path dir = testing::temp_dir("serve-bad-model");
  testing::write_text(dir / "model_index.json", "{ not json");
  std::string log;
  const auto before = std::chrono::steady_clock::now();
  EXPECT_NE(testing::run_klein("serve -m " + testing::shell_arg(dir) + " --port 0", &log), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(30));
  EXPECT_NE(log.find("listening on http://"), std::string::npos) << log;
  EXPECT_NE(log.find("model_index.json"), std::string::npos) << log;
}

// Scrapes /metrics until `done` holds of it, for up to `seconds`; the last scrape.
template <class Done>
Exposition scrape_until(const ServeProcess& serve, Done done, double seconds = 20) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Exposition e = scrape(serve);
  while (!done(e) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    e = scrape(serve);
  }
  return e;
}

// A request far longer than the tests wait (1024x1024, 100 steps of the tiny model), from a
// client that gives up after `patience` seconds (closing its connection); the status, or -1
// when it gave up.
std::future<int> slow_request(const ServeProcess& serve, int patience) {
  return std::async(std::launch::async, [&serve, patience] {
    httplib::Client c("127.0.0.1", serve.port());
    c.set_read_timeout(patience, 0);
    auto r = c.Post("/v1/images/generations",
                    json{{"prompt", kPrompt}, {"size", "1024x1024"}, {"steps", 100}}.dump(),
                    "application/json");
    return r ? r->status : -1;
  });
}

// A synchronous request whose client closes the connection is cancelled, running or waiting
// its turn; the server goes on to the next request.
TEST(Serve, AClientThatLeavesHasItsRequestCancelled) {
  ServeProcess serve;
  const std::string route = "/v1/images/generations";
  const Labels cancelled = {{"route", route}, {"kind", "cancelled"}};
  auto running = [](const Exposition& e) { return e.get("klein_running") == 1; };

  // Running: the client leaves after a second.
  std::future<int> leaving = slow_request(serve, 1);
  EXPECT_EQ(scrape_until(serve, running).get("klein_running"), 1);
  EXPECT_EQ(leaving.get(), -1);
  const auto left = std::chrono::steady_clock::now();
  Exposition e = scrape_until(serve, [&](const Exposition& x) {
    return x.get("klein_errors_total", cancelled) == 1 && x.get("klein_running") == 0;
  });
  EXPECT_EQ(e.get("klein_errors_total", cancelled), 1);
  EXPECT_EQ(e.get("klein_running"), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - left, std::chrono::seconds(10));
  EXPECT_EQ(e.get("klein_images_generated_total", {{"route", route}}), std::nullopt)
      << "the generation finished before its client left";

  // Waiting: a patient request runs, a second one waits behind it and leaves.
  std::future<int> patient = slow_request(serve, 600);
  EXPECT_EQ(scrape_until(serve, running).get("klein_running"), 1);
  std::future<int> queued = slow_request(serve, 1);
  EXPECT_EQ(scrape_until(serve, [](const Exposition& x) { return x.get("klein_queue_depth") == 1; })
                .get("klein_queue_depth"),
            1);
  EXPECT_EQ(queued.get(), -1);
  // The error is counted as the request ends, the queue's depth as it leaves the queue: two
  // moments, so wait for both.
  e = scrape_until(serve, [&](const Exposition& x) {
    return x.get("klein_errors_total", cancelled) == 2 && x.get("klein_queue_depth") == 0;
  });
  EXPECT_EQ(e.get("klein_errors_total", cancelled), 2);
  EXPECT_EQ(e.get("klein_queue_depth"), 0);
  EXPECT_EQ(e.get("klein_running"), 1);  // the patient one still runs

  httplib::Client c = serve.client();
  EXPECT_EQ(post_json(c, "/sdapi/v1/interrupt", json::object())["interrupted"], true);
  EXPECT_EQ(patient.get(), 503);
  const json next = post_json(c, route, {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}});
  EXPECT_EQ(next["data"].size(), 1u);
  EXPECT_EQ(serve.stop(), 0);
}

Image decoded_png(const json& b64) {
  const std::string bytes = base64_decode(b64.get<std::string>()).value_or("");
  return decode_image(std::as_bytes(std::span(bytes.data(), bytes.size())), "reply");
}

json get_job(httplib::Client& c, const std::string& id, int status = 200) {
  auto r = c.Get(("/v1/jobs/" + id).c_str());
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, status) << r->body;
  return json::parse(r->body, nullptr, false);
}

// Polls a job until `state`, for up to 20 s; the last reply.
json wait_for_state(httplib::Client& c, const std::string& id, const std::string& state) {
  json j;
  for (int i = 0; i < 400; ++i) {
    j = get_job(c, id);
    if (j.value("state", "") == state) return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "job " << id << " never " << state << ": " << j.dump().substr(0, 500);
  return j;
}

struct Event {
  std::string name;
  json data;
};

// The events of a text/event-stream body ("event: NAME\ndata: JSON\n\n" each).
std::vector<Event> parse_events(const std::string& stream) {
  std::vector<Event> events;
  size_t start = 0;
  for (size_t end; (end = stream.find("\n\n", start)) != std::string::npos; start = end + 2) {
    const std::string block = stream.substr(start, end - start);
    const size_t newline = block.find('\n');
    EXPECT_TRUE(block.starts_with("event: ") && newline != std::string::npos &&
                block.compare(newline + 1, 6, "data: ") == 0)
        << block.substr(0, 200);
    if (newline == std::string::npos) break;
    events.push_back(
        {block.substr(7, newline - 7), json::parse(block.substr(newline + 7), nullptr, false)});
  }
  EXPECT_EQ(start, stream.size()) << "a partial event at the end";
  return events;
}

// POST /v1/jobs makes the synchronous route's image, its events stream its progress to the
// result, DELETE cancels a running or a waiting job and forgets a finished one, and at most
// --max-jobs are kept. (The time to live is long here, so that no job expires during the test
// however slowly it runs; the next test checks the expiry.)
TEST(Serve, JobsRunAsynchronouslyStreamTheirProgressAndCanBeCancelled) {
  ServeProcess serve("--job-ttl 3600 --max-jobs 3");
  httplib::Client c = serve.client();
  const json body = {{"prompt", kPrompt}, {"size", "64x48"}, {"seed", 5}, {"steps", 3}};
  const json sync = post_json(c, "/v1/images/generations", body);

  const json submitted = post_json(c, "/v1/jobs", body, 202);
  const std::string id = submitted.value("id", "");
  EXPECT_EQ(id.size(), 32u);
  EXPECT_TRUE(submitted["state"] == "queued" || submitted["state"] == "running") << submitted;
  std::string stream;
  auto streamed = c.Get(("/v1/jobs/" + id + "/events").c_str(), [&](const char* data, size_t n) {
    stream.append(data, n);
    return true;
  });
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_EQ(streamed->get_header_value("Content-Type"), "text/event-stream");
  const std::vector<Event> events = parse_events(stream);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().name, "done");
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    EXPECT_EQ(events[i].name, "progress");
    EXPECT_FALSE(events[i].data.contains("result")) << "a result before the end";
  }
  const json done = events.back().data;
  EXPECT_EQ(done["state"], "done");
  EXPECT_EQ(done["progress"], 1.0);
  ASSERT_EQ(done["result"]["data"].size(), 1u);
  EXPECT_EQ(done["result"]["data"][0]["seed"], 5);
  EXPECT_EQ(decoded_png(done["result"]["data"][0]["b64_json"]).rgb,
            decoded_png(sync["data"][0]["b64_json"]).rgb);
  EXPECT_EQ(decoded_png(done["preview"]).width, 8);  // the last step's preview, 1/8 of 64

  const json collected = get_job(c, id);
  EXPECT_EQ(collected["state"], "done");
  EXPECT_EQ(collected["result"], done["result"]);
  auto deleted = c.Delete(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(deleted);
  EXPECT_EQ(json::parse(deleted->body)["deleted"], true);
  const json unknown = get_job(c, id, 404);
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("--job-ttl"), std::string::npos);

  // A running job and one waiting behind it, both deleted.
  const json slow = {{"prompt", kPrompt}, {"size", "1024x1024"}, {"steps", 100}};
  const std::string first = post_json(c, "/v1/jobs", slow, 202).value("id", "");
  const std::string second = post_json(c, "/v1/jobs", slow, 202).value("id", "");
  json running = wait_for_state(c, first, "running");
  for (int i = 0; i < 400 && running["preview"].is_null(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    running = get_job(c, first);
  }
  EXPECT_EQ(running["steps"], 100);
  EXPECT_GE(running["step"].get<int>(), 1);
  EXPECT_GT(running["progress"].get<double>(), 0.0);
  EXPECT_EQ(decoded_png(running["preview"]).width, 128);
  const json waiting = get_job(c, second);
  EXPECT_EQ(waiting["state"], "queued");
  EXPECT_EQ(waiting["queue_position"], 1) << waiting;  // the running one is ahead of it
  EXPECT_FALSE(running.contains("queue_position")) << running;

  auto cancel = c.Delete(("/v1/jobs/" + second).c_str());
  ASSERT_TRUE(cancel);
  EXPECT_EQ(json::parse(cancel->body)["cancel_requested"], true);
  EXPECT_EQ(wait_for_state(c, second, "cancelled")["error"]["code"], 503);
  EXPECT_EQ(get_job(c, first)["state"], "running");  // the waiting one went, not the running one
  ASSERT_TRUE(c.Delete(("/v1/jobs/" + first).c_str()));
  const auto asked = std::chrono::steady_clock::now();
  const json stopped = wait_for_state(c, first, "cancelled");
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(10));
  EXPECT_NE(stopped["error"]["message"].get<std::string>().find("DELETE"), std::string::npos);
  EXPECT_EQ(scrape(serve).get("klein_errors_total", {{"route", "/v1/jobs"}, {"kind", "cancelled"}}),
            2);

  // --max-jobs 3: with two finished jobs kept, a fourth job makes the one that finished first
  // (the waiting one, cancelled first) go.
  const json quick = {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}};
  const std::string third = post_json(c, "/v1/jobs", quick, 202).value("id", "");
  wait_for_state(c, third, "done");
  const std::string fourth = post_json(c, "/v1/jobs", quick, 202).value("id", "");
  get_job(c, second, 404);
  EXPECT_EQ(get_job(c, first)["state"], "cancelled");
  wait_for_state(c, fourth, "done");
  EXPECT_EQ(scrape(serve).get("klein_jobs"), 3);
  get_job(c, "0123456789abcdef", 404);
  EXPECT_EQ(serve.stop(), 0);
}

// --job-ttl: a finished job is kept for its time to live, collected or not, and goes after it.
// Checked against bounds the client knows rather than fixed sleeps: the job cannot have
// finished before it was submitted, so it is there until submitted + TTL; it finished before
// the client saw it done, so it is gone soon after seen + TTL.
TEST(Serve, FinishedJobsExpireAfterTheirTimeToLive) {
  constexpr double kTtl = 2;
  ServeProcess serve("--job-ttl 2");
  httplib::Client c = serve.client();
  const json quick = {{"prompt", kPrompt}, {"size", "32x32"}, {"steps", 1}};
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  const auto submitted = Clock::now();
  const std::string id = post_json(c, "/v1/jobs", quick, 202).value("id", "");
  wait_for_state(c, id, "done");
  const auto seen_done = Clock::now();
  EXPECT_EQ(scrape(serve).get("klein_jobs"), 1);
  bool gone = false;
  while (!gone && seconds_since(seen_done) < kTtl + 10) {
    auto r = c.Get(("/v1/jobs/" + id).c_str());
    ASSERT_TRUE(r);
    gone = r->status == 404;
    if (gone)  // the server looked before this reply arrived
      EXPECT_GE(seconds_since(submitted), kTtl) << "the job went before its time to live";
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "the job is still kept " << seconds_since(seen_done)
                    << " s after it finished, with --job-ttl " << kTtl;
  EXPECT_EQ(scrape(serve).get("klein_jobs"), 0);
  EXPECT_EQ(serve.stop(), 0);
}

}  // namespace
}  // namespace klein
