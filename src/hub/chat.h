#pragma once
// Prompt upsampling by a remote model: one request to an OpenAI-compatible chat completions
// service (llama.cpp's server, vLLM, OpenRouter, ...), as BFL's FLUX.2 reference does with
// its remote upsampler, falling back to the user's prompt when the service fails.
//
// What goes out: POST <url>/chat/completions with {"model", "messages": [system, user],
// "max_tokens"[, "temperature"]}, the user turn a text, or for an edit the text and the
// reference images as data URLs (OpenAI's image_url parts); "Authorization: Bearer KEY" when a
// key is given. Only http and https; no redirect is followed (nothing is sent to a host but
// the one named); the whole exchange has one deadline (connect, request, a slow body). The
// answer is choices[0].message.content. Errors name the URL and what failed, never the key.
#include <string>
#include <vector>

namespace klein::hub {

struct ChatEndpoint {
  std::string url;    // an API base (".../v1") or the full ".../chat/completions" URL
  std::string model;  // the request's "model" ("" leaves it out: a server with one model)
  std::string key;    // bearer token; "" sends none
  double timeout_seconds = 60;
  int max_tokens = 512;
  double temperature = -1;  // < 0: left out (the service's default)
};

struct ChatImage {
  std::string mime;   // "image/png", "image/jpeg", "image/webp"
  std::string bytes;  // the file's bytes
};

// The URL the request goes to: `url` when it ends in /chat/completions, else url +
// "/chat/completions". Throws naming `option` for anything but an http(s) URL with a host.
std::string completions_url(const std::string& url, const std::string& option);

// The assistant's text in a reply body: choices[0].message.content (a string, or the text
// parts of an array), a leading <think> block left out, trimmed. Throws Error for a body that
// is not JSON or holds no answer.
std::string chat_answer(const std::string& body);

// One completion: the assistant's text. Throws Error on any failure.
std::string chat_completion(const ChatEndpoint& endpoint, const std::string& system,
                            const std::string& user, const std::vector<ChatImage>& images = {});

struct RemoteUpsample {
  std::string prompt;   // the rewritten prompt, or the user's after a failure
  bool fell_back = false;
  std::string warning;  // why it fell back
  double seconds = 0;
};

// The rewrite by `endpoint` under `system`; on any failure (or an empty answer) the user's
// prompt with a warning saying why, unless `strict` (then it throws).
RemoteUpsample remote_upsample(const ChatEndpoint& endpoint, const std::string& system,
                               const std::string& prompt, const std::vector<ChatImage>& images,
                               bool strict);

}  // namespace klein::hub
