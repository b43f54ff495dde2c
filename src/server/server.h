#pragma once
// `klein serve`: one model, opened once, behind an HTTP API that image front-ends already
// speak. The server parses requests into GenerateOptions, runs them through the pipeline
// stages one at a time, and answers with base64 PNGs:
//
//   GET  /                         a web page: the form, progress with the preview, cancel
//   GET  /health                   {"status", "model", "busy", "queue"}
//   POST /v1/images/generations    OpenAI images API (JSON): prompt, size "WxH", n,
//                                  response_format b64_json; extensions seed, steps,
//                                  guidance, negative_prompt
//   POST /v1/images/edits          OpenAI images API (multipart): image / image[] files,
//                                  optional mask (white repaints; then the first image is
//                                  the init image), prompt, size, n, strength, ...
//   POST /sdapi/v1/txt2img         the AUTOMATIC1111 API: prompt, negative_prompt, width,
//   POST /sdapi/v1/img2img         height, steps, seed (-1: random), cfg_scale, batch_size,
//                                  n_iter; img2img adds init_images, mask,
//                                  denoising_strength
//   GET  /sdapi/v1/progress        the running request: fraction done, ETA, step, and the
//                                  last step's preview (base64 PNG, one pixel per 8x8)
//   POST /sdapi/v1/interrupt       cancels the running request (it gets 503)
//
// Replies give each seed as a number and as a string (OpenAI data[i].seed_str, A1111 info's
// seed_str and all_seeds_str): a seed the user gave may be any 64-bit value, and a JSON
// number above 2^53 - 1 is not exact in JavaScript (random seeds are below 2^32).
//
// Requests wait their turn (one generation at a time on the shared compute context); more
// than max_queue waiting get 429. With an API key every request but /health needs
// "Authorization: Bearer KEY" (401 otherwise). Bad requests get 400 with a message naming
// the field. stop() (SIGINT/SIGTERM in the CLI) cancels the running generation, answers the
// waiting ones with 503 and returns from run().
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ops/compute.h"
#include "pipeline/pipeline.h"

namespace klein {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (bind() returns it)
  std::string api_key;           // empty: no authentication
  int max_queue = 4;             // requests waiting behind the running one; more get 429
  int64_t max_side = 2048;       // largest width or height a request may ask for
  int max_images = 4;            // n, or batch_size x n_iter
  size_t max_body_bytes = size_t(64) << 20;
  std::optional<uint64_t> max_memory;  // the generations' memory budget (--max-memory)
  std::optional<Residency> residency;  // forced (--residency), else the memory plan decides
  Precision precision = Precision::Auto;
  // LoRAs requests may use, by file name without ".safetensors" (A1111's <lora:NAME:SCALE> in
  // the prompt); empty: none. Requests never name files.
  std::filesystem::path lora_dir;
};

class Server {
 public:
  Server(Model& model, Compute& cx, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket; returns the port (the chosen one when options.port is 0). Throws
  // klein::Error when the address cannot be bound.
  int bind();
  // Serves until stop(). Call after bind().
  void run();
  // From any thread (a signal-waiting thread): cancel, refuse, return from run().
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace klein
