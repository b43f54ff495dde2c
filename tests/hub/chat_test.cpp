// Prompt upsampling by a remote model (hub/chat.h) against a stand-in OpenAI-compatible server
// on the loopback address: what is sent (the messages, the model, the key, the images), what
// is read back, and every way the service can fail (an HTTP error, a body that is not JSON or
// has no answer, a redirect, a server that does not answer or answers slowly, no server at
// all): each an error naming the URL and never the key, within the timeout, and nothing sent
// to another host; remote_upsample falls back to the prompt with a warning unless strict. Then
// the same through `klein upsample` and `klein generate --upsample`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/base64.h"
#include "core/error.h"
#include "core/files.h"
#include "formats/image/image.h"
#include "hub/chat.h"
#include "support/testing.h"

namespace klein::chat_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kKey = "sk-test-7f3a9c1d2e";
constexpr const char* kAnswer = "A small red cube on a polished oak table, soft studio light.";

// An OpenAI-compatible chat completions server whose behaviour the test picks per request.
class StandIn {
 public:
  enum class Mode { Answer, Status500, NotJson, NoChoices, Redirect, Silent, SlowBody, Empty };
  explicit StandIn(Mode mode = Mode::Answer) : mode_(mode) {
    server_.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) {
      {
        const std::lock_guard lock(mutex_);
        bodies_.push_back(q.body);
        auth_.push_back(q.get_header_value("Authorization"));
      }
      switch (mode_.load()) {
        case Mode::Answer:
          r.set_content(json({{"choices", {{{"message", {{"role", "assistant"}, {"content", kAnswer}}}}}}})
                            .dump(),
                        "application/json");
          break;
        case Mode::Status500:  // an error body that echoes the request's key
          r.status = 500;
          r.set_content(std::string("upstream failed for ") + q.get_header_value("Authorization"),
                        "text/plain");
          break;
        case Mode::NotJson:
          r.set_content("<html>busy</html>", "text/html");
          break;
        case Mode::NoChoices:
          r.set_content(R"({"error": {"message": "model not found"}})", "application/json");
          break;
        case Mode::Redirect:
          r.status = 307;
          r.set_header("Location", other_ + "/v1/chat/completions");
          break;
        case Mode::Silent:
          std::this_thread::sleep_for(std::chrono::seconds(3));
          r.set_content("{}", "application/json");
          break;
        case Mode::SlowBody:
          r.set_chunked_content_provider("application/json", [](size_t, httplib::DataSink& sink) {
            for (int i = 0; i < 30; ++i) {
              if (!sink.write(" ", 1)) return false;
              std::this_thread::sleep_for(std::chrono::milliseconds(100));
            }
            sink.done();
            return true;
          });
          break;
        case Mode::Empty:
          r.set_content(json({{"choices", {{{"message", {{"content", "  \n"}}}}}}}).dump(),
                        "application/json");
          break;
      }
    });
    // The host a redirect points to: it must never be asked.
    other_server_.Post(".*", [this](const httplib::Request&, httplib::Response& r) {
      ++other_hits_;
      r.set_content("{}", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    other_ = "http://127.0.0.1:" + std::to_string(other_server_.bind_to_any_port("127.0.0.1"));
    threads_.emplace_back([this] { server_.listen_after_bind(); });
    threads_.emplace_back([this] { other_server_.listen_after_bind(); });
    // stop() before the loop has started would leave it running forever.
    while (!server_.is_running() || !other_server_.is_running())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~StandIn() {
    server_.stop();
    other_server_.stop();
    for (auto& t : threads_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }
  std::vector<std::string> bodies() {
    const std::lock_guard lock(mutex_);
    return bodies_;
  }
  std::vector<std::string> auth() {
    const std::lock_guard lock(mutex_);
    return auth_;
  }
  int other_hits() const { return other_hits_; }

 private:
  std::atomic<Mode> mode_;
  httplib::Server server_, other_server_;
  int port_ = 0;
  std::string other_;
  std::atomic<int> other_hits_{0};
  std::mutex mutex_;
  std::vector<std::string> bodies_, auth_;
  std::vector<std::thread> threads_;
};

hub::ChatEndpoint endpoint(const StandIn& s, double timeout = 5) {
  hub::ChatEndpoint e;
  e.url = s.url();
  e.model = "pixtral-large";
  e.key = kKey;
  e.timeout_seconds = timeout;
  e.max_tokens = 300;
  return e;
}

TEST(ChatCompletion, SendsTheMessagesModelAndKeyAndReadsTheAnswer) {
  StandIn s;
  EXPECT_EQ(hub::chat_completion(endpoint(s), "You rewrite prompts.", "a red cube"), kAnswer);
  ASSERT_EQ(s.bodies().size(), 1u);
  const json body = json::parse(s.bodies()[0]);
  EXPECT_EQ(body["model"], "pixtral-large");
  EXPECT_EQ(body["max_tokens"], 300);
  EXPECT_FALSE(body.contains("temperature"));
  ASSERT_EQ(body["messages"].size(), 2u);
  EXPECT_EQ(body["messages"][0], json({{"role", "system"}, {"content", "You rewrite prompts."}}));
  EXPECT_EQ(body["messages"][1], json({{"role", "user"}, {"content", "a red cube"}}));
  EXPECT_EQ(s.auth()[0], std::string("Bearer ") + kKey);
  // No key: no Authorization header at all; the full URL is taken as it is.
  hub::ChatEndpoint e = endpoint(s);
  e.key.clear();
  e.url = s.url() + "/chat/completions/";
  EXPECT_EQ(hub::chat_completion(e, "sys", "x"), kAnswer);
  EXPECT_EQ(s.auth()[1], "");
}

TEST(ChatCompletion, SendsAnEditsImagesAsDataUrls) {
  StandIn s;
  const std::string png = read_text_file(testing::tiny_vectors() / "inputs" / "ref0.png");
  hub::ChatEndpoint e = endpoint(s);
  e.temperature = 0.15;
  EXPECT_EQ(hub::chat_completion(e, "sys", "make it blue", {{"image/png", png}}), kAnswer);
  const json body = json::parse(s.bodies()[0]);
  EXPECT_DOUBLE_EQ(body["temperature"].get<double>(), 0.15);
  const json& content = body["messages"][1]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0], json({{"type", "text"}, {"text", "make it blue"}}));
  EXPECT_EQ(content[1]["type"], "image_url");
  EXPECT_EQ(content[1]["image_url"]["url"], "data:image/png;base64," + base64_encode(png));
}

// Each failure: an error naming the URL and what failed, never the key, within the timeout.
TEST(ChatCompletion, EveryFailureIsAnErrorNamingTheUrlNotTheKey) {
  struct Case {
    StandIn::Mode mode;
    const char* says;
  };
  for (const Case& c : {Case{StandIn::Mode::Status500, "HTTP status 500: upstream failed for Bearer ***"},
                        Case{StandIn::Mode::NotJson, "the reply is not JSON: <html>busy</html>"},
                        Case{StandIn::Mode::NoChoices, "no choices[0].message.content"},
                        Case{StandIn::Mode::Redirect, "a redirect to http://127.0.0.1:"},
                        Case{StandIn::Mode::Silent, "no complete reply within"},
                        Case{StandIn::Mode::SlowBody, "no complete reply within"}}) {
    SCOPED_TRACE(c.says);
    StandIn s(c.mode);
    const auto start = std::chrono::steady_clock::now();
    const std::string e = testing::error_of([&] { hub::chat_completion(endpoint(s, 1.0), "sys", "x"); });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_THAT(e, HasSubstr(s.url() + "/chat/completions: "));
    EXPECT_THAT(e, HasSubstr(c.says));
    EXPECT_THAT(e, Not(HasSubstr(kKey)));
    EXPECT_LT(seconds, 2.5) << "not within the timeout";
    EXPECT_EQ(s.other_hits(), 0) << "a redirect was followed";
  }
  // Nothing listening.
  std::string closed;
  {
    StandIn gone;
    closed = gone.url();
  }
  hub::ChatEndpoint e;
  e.url = closed;
  e.key = kKey;
  e.timeout_seconds = 2;
  const std::string refused = testing::error_of([&] { hub::chat_completion(e, "sys", "x"); });
  EXPECT_THAT(refused, HasSubstr(closed));
  EXPECT_THAT(refused, Not(HasSubstr(kKey)));
  // Not an http(s) URL.
  e.url = "file:///etc/passwd";
  EXPECT_THAT(testing::error_of([&] { hub::chat_completion(e, "sys", "x"); }),
              HasSubstr("expected an http:// or https:// URL"));
  e.url = "http:///v1";
  EXPECT_THAT(testing::error_of([&] { hub::chat_completion(e, "sys", "x"); }), HasSubstr("no host"));
}

TEST(RemoteUpsample, FallsBackToThePromptUnlessStrict) {
  StandIn ok;
  hub::RemoteUpsample r = hub::remote_upsample(endpoint(ok), "sys", "a red cube", {}, false);
  EXPECT_EQ(r.prompt, kAnswer);
  EXPECT_FALSE(r.fell_back);
  StandIn failing(StandIn::Mode::Status500);
  r = hub::remote_upsample(endpoint(failing), "sys", "a red cube", {}, false);
  EXPECT_EQ(r.prompt, "a red cube");
  EXPECT_TRUE(r.fell_back);
  EXPECT_THAT(r.warning, HasSubstr("HTTP status 500"));
  EXPECT_THAT(r.warning, Not(HasSubstr(kKey)));
  EXPECT_THROW(hub::remote_upsample(endpoint(failing), "sys", "a red cube", {}, true), Error);
  StandIn empty(StandIn::Mode::Empty);
  r = hub::remote_upsample(endpoint(empty), "sys", "a red cube", {}, false);
  EXPECT_TRUE(r.fell_back);
  EXPECT_THAT(r.warning, HasSubstr("the answer is empty"));
}

// Sets an environment variable for the klein processes a test starts, and unsets it after.
struct EnvVar {
  EnvVar(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~EnvVar() { ::unsetenv(name_); }
  const char* name_;
};

TEST(UpsampleCli, RemoteModelRewritesAndFallsBackWithoutTheKeyInAnyOutput) {
  StandIn s;
  const EnvVar key("KLEIN_TEST_CHAT_KEY", kKey);
  std::string log;
  const std::string remote = " --upsample-endpoint " + testing::shell_arg(s.url()) +
                             " --upsample-model pixtral-large --upsample-key-env KLEIN_TEST_CHAT_KEY";
  ASSERT_EQ(testing::run_klein("upsample -p \"a red cube\"" + remote, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr(kAnswer));
  EXPECT_THAT(log, Not(HasSubstr(kKey)));
  ASSERT_EQ(s.bodies().size(), 1u);
  const json body = json::parse(s.bodies()[0]);
  EXPECT_EQ(body["messages"][1]["content"], "a red cube");
  EXPECT_EQ(body["max_tokens"], 512);
  EXPECT_EQ(s.auth()[0], std::string("Bearer ") + kKey);

  // klein generate --upsample: the image records both prompts, and nowhere the key.
  const fs::path out = testing::temp_dir("remote-upsample");
  ASSERT_EQ(testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                   " -p \"a red cube\" -W 64 -H 64 -s 2 --seed 1 --no-cache --upsample" +
                                   remote + " -o " + testing::shell_arg(out / "a.png"),
                               &log),
            0)
      << log;
  EXPECT_THAT(log, Not(HasSubstr(kKey)));
  std::string metadata;
  for (const auto& [k, v] : read_image_metadata(out / "a.png")) metadata += k + "=" + v + "\n";
  EXPECT_THAT(metadata, HasSubstr(kAnswer));
  EXPECT_THAT(metadata, HasSubstr("\"original_prompt\":\"a red cube\""));
  EXPECT_THAT(metadata, Not(HasSubstr(kKey)));

  // A failing service: the prompt as given, a warning, exit 0; --upsample-strict: exit 1.
  StandIn failing(StandIn::Mode::Status500);
  const std::string bad = " --upsample-endpoint " + testing::shell_arg(failing.url()) +
                          " --upsample-key-env KLEIN_TEST_CHAT_KEY";
  ASSERT_EQ(testing::run_klein("upsample -p \"a red cube\"" + bad, &log), 0) << log;
  EXPECT_THAT(log, HasSubstr("warning: prompt upsampling failed, the prompt is used as given"));
  EXPECT_THAT(log, HasSubstr("a red cube"));
  EXPECT_THAT(log, Not(HasSubstr(kKey)));
  EXPECT_NE(testing::run_klein("upsample -p \"a red cube\" --upsample-strict" + bad, &log), 0);
  EXPECT_THAT(log, HasSubstr("HTTP status 500"));
  EXPECT_THAT(log, Not(HasSubstr(kKey)));
}

TEST(UpsampleCli, RemoteOptionsAreCheckedBeforeAnyWork) {
  std::string log;
  EXPECT_NE(testing::run_klein("upsample -p x --upsample-endpoint ftp://example.org/v1", &log), 0);
  EXPECT_THAT(log, HasSubstr("--upsample-endpoint ftp://example.org/v1: expected an http"));
  ::unsetenv("KLEIN_TEST_UNSET_KEY");
  EXPECT_NE(testing::run_klein("upsample -p x --upsample-endpoint http://127.0.0.1:9/v1 "
                               "--upsample-key-env KLEIN_TEST_UNSET_KEY",
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("KLEIN_TEST_UNSET_KEY: the environment variable is not set"));
  EXPECT_NE(testing::run_klein("upsample -p x --upsample-model m", &log), 0);
  EXPECT_THAT(log, HasSubstr("need --upsample-endpoint"));
  const fs::path out = testing::temp_dir("remote-upsample-refused") / "a.png";
  EXPECT_NE(testing::run_klein("generate -m " + testing::shell_arg(testing::tiny_model()) +
                                   " -p x --upsample-endpoint http://127.0.0.1:9/v1 -o " +
                                   testing::shell_arg(out),
                               &log),
            0);
  EXPECT_THAT(log, HasSubstr("--upsample-endpoint needs --upsample"));
  EXPECT_THAT(log, Not(HasSubstr("text encoder")));
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace klein::chat_test
