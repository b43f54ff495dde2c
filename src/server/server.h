#pragma once
// `klein serve`: one model, opened once, behind an HTTP API that image front-ends already
// speak. The server parses requests into GenerateOptions, runs them through the pipeline
// stages one at a time, and answers with base64 PNGs:
//
//   GET  /                         a web page: the form, progress with the preview, cancel
//   GET  /health                   {"status", "model", "busy", "queue", "safety": {"enabled",
//                                  "threshold", "action"}, "tiny_decoder": {"enabled",
//                                  "file"}} (and, when ready,
//                                  "family" and "accepts": the request fields the model
//                                  takes beyond a prompt): 200 "ok" once the
//                                  model is open, 503 "loading" before (a load balancer's
//                                  readiness check)
//   GET  /metrics                  Prometheus text format: queue depth, running, images and
//                                  errors by route (and kind), generation seconds
//                                  (histogram), seconds per pipeline phase, peak RSS
//   POST /v1/images/generations    OpenAI images API (JSON): prompt, size "WxH", n,
//                                  response_format b64_json; extensions seed, steps,
//                                  guidance, negative_prompt, decoder ("full" or, with the
//                                  server's --tiny-vae, "tiny"), upsample (true: the prompt
//                                  rewritten first; revised_prompt gives it), and editing:
//                                  references (base64 images or data URLs), init_image,
//                                  mask, strength
//   POST /v1/images/edits          OpenAI images API (multipart): image / image[] files,
//                                  optional mask (white repaints; then the first image is
//                                  the init image), prompt, size, n, strength, ...
//   POST /sdapi/v1/txt2img         the AUTOMATIC1111 API: prompt, negative_prompt, width,
//   POST /sdapi/v1/img2img         height, steps, seed (-1: random), cfg_scale, batch_size,
//                                  n_iter; img2img adds init_images, mask,
//                                  denoising_strength
//   GET  /sdapi/v1/progress        the running request: fraction done, ETA, step, and the
//                                  last step's preview (base64 PNG: the tiny decoder's picture
//                                  with one, else the colour fit, one pixel per 8x8)
//   POST /sdapi/v1/interrupt       cancels the running request (it gets 503)
//   POST /v1/jobs                  an asynchronous /v1/images/generations: the same JSON
//                                  body, answered at once with 202 {"id", "state", ...}
//   GET  /v1/jobs/{id}             {"id", "state" (queued, running, done, failed,
//                                  cancelled), "progress", "step", "steps", "preview",
//                                  "result" (the /v1/images/generations reply, when done),
//                                  "error" (when failed)}
//   DELETE /v1/jobs/{id}           cancels a queued or running job; forgets a finished one
//   GET  /v1/jobs/{id}/events      server-sent events (text/event-stream): "progress" while
//                                  it waits and runs, then one of "done", "failed",
//                                  "cancelled" with the job's JSON, and the stream ends
//
// Jobs stay until job_ttl_seconds after they finish, whether collected or not; at most
// max_jobs are kept (the oldest finished one is dropped for a new one; with none finished a
// new job gets 429).
//
// Replies give each seed as a number and as a string (OpenAI data[i].seed_str, A1111 info's
// seed_str and all_seeds_str): a seed the user gave may be any 64-bit value, and a JSON
// number above 2^53 - 1 is not exact in JavaScript (random seeds are below 2^32).
//
// Requests wait their turn (one generation at a time on the shared compute context); more
// than max_queue waiting (jobs included) get 429. A synchronous request whose client closes
// the connection is cancelled, waiting or running. With an API key every request but /health
// and /metrics needs "Authorization: Bearer KEY" (401 otherwise): a load balancer's probe
// and a metrics scraper usually carry no key, and neither route tells anything about the
// images. Bad requests get 400 with a message naming the field; an image the safety check
// flags (an input, or the generated one unless the action is blur) gets 422 with a message
// naming its nsfw probability and the threshold. stop() (SIGINT/SIGTERM in the
// CLI) cancels the running generation, answers the waiting ones with 503 and returns from
// run().
//
// The server may bind and serve before its model is open (set_model() makes it ready): until
// then /health answers 503 {"status": "loading"} and the generation routes 503.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "hub/chat.h"
#include "ops/compute.h"
#include "pipeline/pipeline.h"
#include "pipeline/upsample.h"

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
  // Z-Image's control model (a diffusers directory or the original single file) that requests
  // with a "control_image" use; empty: none. Requests never name files.
  std::filesystem::path controlnet;
  double job_ttl_seconds = 600;  // a finished job is forgotten this long after it finished
  int max_jobs = 32;             // jobs kept at once, in any state
  // The safety check of every request's input and generated images (pipeline/safety.h),
  // with the classifier opened by the caller; a flagged image is answered with 422 (or
  // blurred with SafetyAction::Blur). No request can turn it off. /health says whether it
  // is on and its threshold.
  SafetyOptions safety;
  // The tiny decoder (pipeline/tiny_decoder.h), opened by the caller; null: none. With one, the
  // step previews of jobs and /sdapi/v1/progress are its pictures (at most 256 pixels a side),
  // and a request's "decoder": "tiny" decodes with it. /health says whether there is one.
  TinyDecoderOptions tiny;
  // Prompt upsampling of requests that ask for it ("upsample": true): by the remote model when
  // there is one (hub/chat.h; falling back to the prompt as given, unless strict), else by the
  // model's own text encoder with these options (a model that cannot is refused by name).
  UpsampleOptions upsample;
  std::optional<hub::ChatEndpoint> upsample_endpoint;
  bool upsample_strict = false;
  // The prompt check of every request (pipeline/prompt_check.h), by the model's text encoder
  // before any other work (upsampling included); a flagged prompt is answered with 422. No
  // request can turn it off. /health says whether it is on.
  bool check_prompt = false;
};

class Server {
 public:
  // A server whose model is still to come (set_model), or ready at once.
  Server(Compute& cx, ServerOptions options);
  Server(Model& model, Compute& cx, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket; returns the port (the chosen one when options.port is 0). Throws
  // klein::Error when the address cannot be bound.
  int bind();
  // The model is open: from now on requests are served. Once; `model` outlives the server.
  void set_model(Model& model);
  // Serves until stop(). Call after bind(). Returns at once when stop() came first.
  void run();
  // From any thread (a signal-waiting thread): cancel, refuse, return from run().
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace klein
