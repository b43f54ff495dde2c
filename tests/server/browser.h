#pragma once
// Headless chromium (Debian's, as scripts/test.sh installs it) driven over the DevTools
// protocol on a pipe (--remote-debugging-pipe: it reads commands on fd 3 and writes answers
// and events on fd 4, each a JSON text ended by a NUL byte), so that a test can load a page,
// fill it and press its buttons as a person would (files through the file picker, a mouse
// dragged over a canvas), and see what the page asked of the network and wrote to its console.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace klein {

class Browser {
 public:
  using json = nlohmann::json;

  explicit Browser(const std::filesystem::path& profile) {
    ::signal(SIGPIPE, SIG_IGN);  // a browser that died fails the write, not the test program
    int commands[2], answers[2];
    EXPECT_EQ(::pipe(commands), 0);
    EXPECT_EQ(::pipe(answers), 0);
    const std::string profile_flag = "--user-data-dir=" + profile.string();
    pid_ = ::fork();
    if (pid_ == 0) {
      // Moved above 4 first, so that placing them at 3 and 4 cannot close one of them.
      const int in = ::fcntl(commands[0], F_DUPFD, 10), out = ::fcntl(answers[1], F_DUPFD, 10);
      ::dup2(in, 3);
      ::dup2(out, 4);
      for (int fd : {commands[0], commands[1], answers[0], answers[1], in, out})
        if (fd > 4) ::close(fd);
      const int null = ::open("/dev/null", O_WRONLY);
      ::dup2(null, STDOUT_FILENO);
      ::dup2(null, STDERR_FILENO);
      ::execl("/usr/bin/chromium", "chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--no-first-run", "--hide-scrollbars", "--remote-debugging-pipe",
              profile_flag.c_str(), "about:blank", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(commands[0]);
    ::close(answers[1]);
    to_ = commands[1];
    from_ = answers[0];
  }
  ~Browser() {
    send("Browser.close", json::object(), "");
    ::close(to_);
    ::close(from_);
    int status = 0;
    if (pid_ > 0) ::waitpid(pid_, &status, 0);
  }
  Browser(const Browser&) = delete;
  Browser& operator=(const Browser&) = delete;

  // Opens a tab at `url` and waits until its page has loaded; the session its commands go to.
  std::string open(const std::string& url) {
    const json target = command("Target.createTarget", {{"url", url}});
    const std::string session =
        command("Target.attachToTarget", {{"targetId", target.value("targetId", "")},
                                          {"flatten", true}})
            .value("sessionId", "");
    wait_for_load(session, url);
    return session;
  }

  // A blank tab that records its network requests and console messages (events()), then
  // goes to `url`.
  std::string open_watched(const std::string& url) {
    const std::string session = open("about:blank");
    for (const char* domain : {"Runtime.enable", "Network.enable", "Log.enable", "Page.enable"})
      command(domain, json::object(), session);
    command("Page.navigate", {{"url", url}}, session);
    wait_for_load(session, url);
    return session;
  }

  // The value of a script expression in the page (a promise is awaited); an exception fails
  // the test.
  json evaluate(const std::string& session, const std::string& expression) {
    const json r = command("Runtime.evaluate",
                           {{"expression", expression}, {"awaitPromise", true},
                            {"returnByValue", true}},
                           session);
    EXPECT_FALSE(r.contains("exceptionDetails")) << r["exceptionDetails"].dump();
    return r.contains("result") ? r["result"].value("value", json()) : json();
  }

  // A command's result; an error answer fails the test.
  json command(const std::string& method, const json& params, const std::string& session = "") {
    const json answer = send(method, params, session);
    EXPECT_FALSE(answer.contains("error")) << method << ": " << answer.dump();
    return answer.value("result", json::object());
  }

  // Chooses files in the <input type=file> that `selector` finds, as the file picker does.
  void choose_files(const std::string& session, const std::string& selector,
                    const std::vector<std::filesystem::path>& files) {
    const int root = command("DOM.getDocument", json::object(), session)["root"].value("nodeId", 0);
    const int node =
        command("DOM.querySelector", {{"nodeId", root}, {"selector", selector}}, session)
            .value("nodeId", 0);
    ASSERT_NE(node, 0) << selector;
    json paths = json::array();
    for (const auto& f : files) paths.push_back(std::filesystem::weakly_canonical(f).string());
    command("DOM.setFileInputFiles", {{"nodeId", node}, {"files", paths}}, session);
  }

  // The left mouse button pressed at the first point, moved through the others, released.
  void drag(const std::string& session, const std::vector<std::pair<double, double>>& points) {
    auto mouse = [&](const char* type, std::pair<double, double> p) {
      command("Input.dispatchMouseEvent",
              {{"type", type}, {"x", p.first}, {"y", p.second}, {"button", "left"},
               {"buttons", std::string(type) == "mouseReleased" ? 0 : 1}, {"clickCount", 1}},
              session);
    };
    mouse("mousePressed", points.front());
    for (size_t i = 1; i < points.size(); ++i) mouse("mouseMoved", points[i]);
    mouse("mouseReleased", points.back());
  }

  // The viewport of a phone (mobile) or of a desktop window, in CSS pixels.
  void viewport(const std::string& session, int width, int height, bool mobile) {
    command("Emulation.setDeviceMetricsOverride",
            {{"width", width}, {"height", height}, {"deviceScaleFactor", 1}, {"mobile", mobile}},
            session);
  }

  // A PNG of what the viewport shows.
  std::string screenshot(const std::string& session) {
    return command("Page.captureScreenshot", {{"format", "png"}}, session)
        .value("data", "");
  }

  // The events seen so far (each {"method", "params", "sessionId"}), in order.
  const std::vector<json>& events() const { return events_; }

 private:
  void wait_for_load(const std::string& session, const std::string& url) {
    // Until the load, the tab may still show about:blank; what runs there is lost.
    const json::json_pointer value("/result/result/value");
    for (int i = 0; i < 1200; ++i) {
      const json r = send("Runtime.evaluate",
                          {{"expression", "location.href + ' ' + document.readyState"},
                           {"returnByValue", true}},
                          session);
      if (r.value(value, "") == url + " complete") return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << url << " did not load";
  }

  // Sends a command and returns its answer (keeping the events before it); {"error": ...}
  // when the browser is gone or silent for two minutes.
  json send(const std::string& method, const json& params, const std::string& session) {
    json message = {{"id", ++id_}, {"method", method}, {"params", params}};
    if (!session.empty()) message["sessionId"] = session;
    const std::string text = message.dump() + '\0';
    if (::write(to_, text.data(), text.size()) != ssize_t(text.size()))
      return {{"error", "cannot write to the browser"}};
    for (;;) {
      const size_t end = buffer_.find('\0');
      if (end == std::string::npos) {
        pollfd p = {from_, POLLIN, 0};
        char chunk[65536];
        const ssize_t n = ::poll(&p, 1, 120000) == 1 ? ::read(from_, chunk, sizeof chunk) : -1;
        if (n <= 0) return {{"error", "no answer from the browser to " + method}};
        buffer_.append(chunk, size_t(n));
        continue;
      }
      json answer = json::parse(buffer_.substr(0, end), nullptr, false);
      buffer_.erase(0, end + 1);
      if (!answer.is_object()) continue;
      if (answer.contains("method") && !answer.contains("id")) {
        events_.push_back(std::move(answer));
        continue;
      }
      if (answer.value("id", 0) == id_) return answer;
    }
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int id_ = 0;
  std::string buffer_;
  std::vector<json> events_;
};

}  // namespace klein
