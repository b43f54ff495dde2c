// The chat completions client of chat.h: one POST with libcurl, one deadline, no redirects.
#include "hub/chat.h"

#include <curl/curl.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/base64.h"
#include "core/error.h"
#include "core/version.h"

namespace klein::hub {

namespace {

using json = nlohmann::json;

constexpr size_t kMaxReply = size_t(4) << 20;  // a chat reply is text: more is refused
constexpr const char* kSuffix = "/chat/completions";

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// `text` with every occurrence of the key replaced, so that a reply echoing it (a server
// that shows the request's headers in its error) never brings it into a message.
std::string without_key(std::string text, const std::string& key) {
  if (key.empty()) return text;
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 3))
    text.replace(at, key.size(), "***");
  return text;
}

// At most `n` bytes of a reply body on one line, for a message.
std::string excerpt(const std::string& body, size_t n) {
  std::string out;
  for (char c : body.substr(0, n)) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (body.size() > n) out += "...";
  return out;
}

struct Reply {
  std::string body;
  bool too_large = false;
};

size_t on_body(char* data, size_t size, size_t n, void* self) {
  auto& r = *static_cast<Reply*>(self);
  if (r.body.size() + size * n > kMaxReply) {
    r.too_large = true;
    return 0;  // stops the transfer
  }
  r.body.append(data, size * n);
  return size * n;
}

struct Curl {
  Curl() {
    static const bool global = [] { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }();
    check(global, "cannot start libcurl");
    handle = curl_easy_init();
    check(handle != nullptr, "cannot start an HTTP transfer (libcurl)");
  }
  ~Curl() {
    curl_slist_free_all(headers);
    curl_easy_cleanup(handle);
  }
  Curl(const Curl&) = delete;
  Curl& operator=(const Curl&) = delete;
  CURL* handle = nullptr;
  curl_slist* headers = nullptr;
};

// The assistant's text in a reply: choices[0].message.content as a string, or the text parts
// of a content array; a <think> block before the answer is left out.
std::string answer_of(const json& reply) {
  const json* content = nullptr;
  if (reply.is_object() && reply.contains("choices") && reply["choices"].is_array() &&
      !reply["choices"].empty() && reply["choices"][0].is_object() &&
      reply["choices"][0].contains("message") && reply["choices"][0]["message"].is_object() &&
      reply["choices"][0]["message"].contains("content"))
    content = &reply["choices"][0]["message"]["content"];
  check(content != nullptr, "the reply has no choices[0].message.content");
  std::string text;
  if (content->is_string()) {
    text = content->get<std::string>();
  } else if (content->is_array()) {
    for (const json& part : *content)
      if (part.is_object() && part.value("type", "") == "text" && part.contains("text") &&
          part["text"].is_string())
        text += part["text"].get<std::string>();
  } else {
    throw Error("the reply's choices[0].message.content is not text");
  }
  if (const size_t open = text.find("<think>"), close = text.find("</think>");
      open != std::string::npos && close != std::string::npos && open < close &&
      text.find_first_not_of(" \t\r\n") == open)
    text.erase(0, close + 8);
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t last = text.find_last_not_of(" \t\r\n");
  return first == std::string::npos ? std::string() : text.substr(first, last - first + 1);
}

}  // namespace

std::string chat_answer(const std::string& body) {
  const json parsed = json::parse(body, nullptr, false);
  check(!parsed.is_discarded(), "the reply is not JSON: ", excerpt(body, 120));
  return answer_of(parsed);
}

std::string completions_url(const std::string& url, const std::string& option) {
  const bool http = url.rfind("http://", 0) == 0, https = url.rfind("https://", 0) == 0;
  check(http || https, option, " ", url, ": expected an http:// or https:// URL (an "
        "OpenAI-compatible API base such as http://127.0.0.1:8080/v1)");
  const std::string rest = url.substr(http ? 7 : 8);
  check(!rest.empty() && rest[0] != '/' && rest.find_first_of(" \t\r\n") == std::string::npos,
        option, " ", url, ": the URL has no host");
  std::string base = url;
  while (ends_with(base, "/")) base.pop_back();
  return ends_with(base, kSuffix) ? base : base + kSuffix;
}

std::string chat_completion(const ChatEndpoint& e, const std::string& system,
                            const std::string& user, const std::vector<ChatImage>& images) {
  const std::string url = completions_url(e.url, "the chat endpoint");
  check(e.timeout_seconds > 0 && e.timeout_seconds <= 3600,
        "chat endpoint timeout: expected more than 0 and at most 3600 seconds, got ",
        e.timeout_seconds);
  json request = {{"messages", json::array()}, {"max_tokens", e.max_tokens}};
  if (!e.model.empty()) request["model"] = e.model;
  if (e.temperature >= 0) request["temperature"] = e.temperature;
  request["messages"].push_back({{"role", "system"}, {"content", system}});
  if (images.empty()) {
    request["messages"].push_back({{"role", "user"}, {"content", user}});
  } else {
    json parts = json::array({{{"type", "text"}, {"text", user}}});
    for (const ChatImage& image : images)
      parts.push_back({{"type", "image_url"},
                       {"image_url",
                        {{"url", "data:" + image.mime + ";base64," + base64_encode(image.bytes)}}}});
    request["messages"].push_back({{"role", "user"}, {"content", parts}});
  }
  const std::string body = request.dump();

  Curl c;
  Reply reply;
  char error[CURL_ERROR_SIZE] = {};
  const long timeout_ms = std::lround(e.timeout_seconds * 1000);
  const std::string agent = std::string("klein-edge/") + KLEIN_VERSION;
  curl_easy_setopt(c.handle, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.handle, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c.handle, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c.handle, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c.handle, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c.handle, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c.handle, CURLOPT_USERAGENT, agent.c_str());
  curl_easy_setopt(c.handle, CURLOPT_POSTFIELDS, body.c_str());
  curl_easy_setopt(c.handle, CURLOPT_POSTFIELDSIZE_LARGE, curl_off_t(body.size()));
  curl_easy_setopt(c.handle, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(c.handle, CURLOPT_WRITEDATA, &reply);
  curl_easy_setopt(c.handle, CURLOPT_ERRORBUFFER, error);
  c.headers = curl_slist_append(c.headers, "Content-Type: application/json");
  c.headers = curl_slist_append(c.headers, "Expect:");  // no 100-continue round trip
  if (!e.key.empty())
    c.headers = curl_slist_append(c.headers, ("Authorization: Bearer " + e.key).c_str());
  curl_easy_setopt(c.handle, CURLOPT_HTTPHEADER, c.headers);

  const CURLcode code = curl_easy_perform(c.handle);
  long status = 0;
  curl_easy_getinfo(c.handle, CURLINFO_RESPONSE_CODE, &status);
  const std::string where = url + ": ";
  check(!reply.too_large, where, "the reply is larger than ", kMaxReply >> 20, " MiB");
  if (code != CURLE_OK)
    throw Error(without_key(where + (error[0] ? error : curl_easy_strerror(code)) +
                                (code == CURLE_OPERATION_TIMEDOUT
                                     ? " (no complete reply within " +
                                           std::to_string(e.timeout_seconds) + " s)"
                                     : ""),
                            e.key));
  if (status >= 300 && status < 400) {
    char* location = nullptr;
    curl_easy_getinfo(c.handle, CURLINFO_REDIRECT_URL, &location);
    throw Error(without_key(where + "HTTP status " + std::to_string(status) + ", a redirect" +
                                (location ? std::string(" to ") + location : std::string()) +
                                ", not followed (requests go to the URL given only)",
                            e.key));
  }
  if (status < 200 || status >= 300)
    throw Error(without_key(
        where + "HTTP status " + std::to_string(status) +
            (reply.body.empty() ? std::string() : ": " + excerpt(reply.body, 300)),
        e.key));
  try {
    return chat_answer(reply.body);
  } catch (const Error& err) {
    throw Error(without_key(where + err.what(), e.key));
  }
}

RemoteUpsample remote_upsample(const ChatEndpoint& endpoint, const std::string& system,
                               const std::string& prompt, const std::vector<ChatImage>& images,
                               bool strict) {
  RemoteUpsample r;
  const auto start = std::chrono::steady_clock::now();
  try {
    r.prompt = chat_completion(endpoint, system, prompt, images);
    check(!r.prompt.empty(), completions_url(endpoint.url, "the chat endpoint"),
          ": the answer is empty");
  } catch (const Error& e) {
    if (strict) throw Error(std::string("prompt upsampling failed: ") + e.what());
    r.prompt = prompt;
    r.fell_back = true;
    r.warning = std::string("prompt upsampling failed, the prompt is used as given: ") + e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace klein::hub
