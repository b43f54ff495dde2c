#pragma once
// What the server tests share: a `klein serve` process of the tiny model on a free port, and
// JSON posted to it.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "formats/image/image.h"
#include "support/build_tree.h"
#include "support/testing.h"

namespace klein {

constexpr const char* kPrompt = "a small red cube";

// A `klein serve` process on a free port, stopped with SIGTERM at the end.
class ServeProcess {
 public:
  explicit ServeProcess(const std::string& extra = "",
                        const std::filesystem::path& model = testing::tiny_model(),
                        bool wait_ready = true) {
    int out[2];
    EXPECT_EQ(::pipe(out), 0);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::close(out[0]);
      ::close(out[1]);
      const std::string command = std::string(testing::klein_binary()) + " serve -m " + model.string() +
                                  " --port 0 --threads 2 " + extra;
      ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    // The first line says where it listens: "... on http://127.0.0.1:PORT (...)".
    std::string line;
    char c;
    while (::read(out[0], &c, 1) == 1 && c != '\n') line += c;
    out_ = out[0];  // kept open: the server prints another line once its model is open
    const size_t colon = line.rfind(':');
    if (colon != std::string::npos) port_ = std::atoi(line.c_str() + colon + 1);
    EXPECT_GT(port_, 0) << "no port in \"" << line << "\"";
    if (wait_ready && port_ > 0) {
      EXPECT_TRUE(ready()) << "/health did not say \"ok\"";
    }
  }
  // Polls /health until it answers 200 (the model opens after the socket is bound); false
  // after a minute.
  bool ready() const {
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 1200; ++i) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  ~ServeProcess() {
    if (pid_ > 0) stop();
  }
  // SIGTERM; the exit status.
  int stop() {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    ::close(out_);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // The process was waited for by the caller: nothing left to stop.
  void forget() {
    pid_ = -1;
    ::close(out_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int out_ = -1;
};

// The PNG of a reply's base64 field, written to `file` (to read its metadata back) and loaded.
inline Image reply_png(const nlohmann::json& b64, const std::filesystem::path& file) {
  std::ofstream(file, std::ios::binary) << base64_decode(b64.get<std::string>()).value_or("");
  return load_image(file);
}

inline nlohmann::json post_json(httplib::Client& c, const std::string& path,
                                const nlohmann::json& body, int status = 200) {
  auto res = c.Post(path.c_str(), body.dump(), "application/json");
  EXPECT_TRUE(res) << path;
  if (!res) return nlohmann::json();
  EXPECT_EQ(res->status, status) << path << ": " << res->body;
  return nlohmann::json::parse(res->body, nullptr, false);
}

}  // namespace klein
