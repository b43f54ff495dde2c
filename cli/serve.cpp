// klein serve: the model opened once behind the HTTP API of src/server/server.h, until
// SIGINT or SIGTERM. The socket is bound first and served while the model opens (/health
// says "loading", 503), so that a load balancer sees the server before it is ready; a model
// that fails to open stops the server and the process exits non-zero with the error.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/upsample_options.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "core/cpu.h"
#include "core/error.h"
#include "ops/compute.h"
#include "pipeline/prompt_check.h"
#include "pipeline/safety.h"
#include "weights/safety_model.h"
#include "models/taesd/taesd.h"
#include "pipeline/tiny_decoder.h"
#include "server/server.h"

namespace klein::cli {
namespace {

struct ServeArgs {
  ModelPaths model;
  ServerOptions server;
  MemoryOptions memory;
  int threads = 0;
  // The safety check: on when a classifier is given (--safety-model, $KLEIN_SAFETY_MODEL, or
  // the model's container holds one) unless --no-safety.
  std::string safety_model;
  bool no_safety = false;
  std::optional<double> safety_threshold;
  std::optional<std::string> safety_action;
  std::string tiny_vae;  // --tiny-vae FILE
  UpsampleArgs upsample;  // requests' "upsample": true
};

// The safety options of the server, the classifier opened (every file checked) before the
// socket is bound.
SafetyOptions safety_options(const ServeArgs& a) {
  SafetyOptions s;
  if (a.safety_threshold) {
    vit::check_threshold(*a.safety_threshold, "--safety-threshold");
    s.threshold = *a.safety_threshold;
  }
  if (a.safety_action) s.action = parse_safety_action(*a.safety_action, "--safety-action");
  if (a.no_safety) {
    check(a.safety_model.empty() && !a.safety_threshold && !a.safety_action,
          "--no-safety with --safety-model, --safety-threshold or --safety-action: give one");
    return s;
  }
  std::string dir = a.safety_model;
  std::string given_by = "--safety-model";
  if (dir.empty())
    if (const char* env = std::getenv("KLEIN_SAFETY_MODEL")) dir = env, given_by = "KLEIN_SAFETY_MODEL";
  // Else the classifier the model's container holds (klein convert --safety-model).
  if (dir.empty() && container_has_safety_model(a.model.model))
    dir = a.model.model.string(), given_by = "-m";
  if (dir.empty()) {
    check(!a.safety_threshold && !a.safety_action,
          "--safety-threshold and --safety-action need a classifier: --safety-model DIR or "
          "KLEIN_SAFETY_MODEL");
    return s;
  }
  s.model = open_shared_safety_model(dir, given_by);
  return s;
}

// SIGINT and SIGTERM write their number into this pipe (write() is async-signal-safe), so
// that whichever thread the kernel picks (OpenBLAS starts threads of its own at load time),
// a normal thread does the stopping.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

void serve(const ServeArgs& a) {
  ServerOptions options = a.server;
  options.max_memory = a.memory.budget();  // a bad size fails before the model is opened
  options.residency = a.memory.forced();
  options.safety = safety_options(a);
  if (!a.tiny_vae.empty()) options.tiny.model = open_shared_tiny_decoder(a.tiny_vae, "--tiny-vae");
  options.upsample = a.upsample.options("upsample-");
  options.upsample_endpoint = a.upsample.remote(options.upsample);
  options.upsample_strict = a.upsample.strict;
  check(::pipe(g_signal_pipe) == 0, "serve: cannot create the signal pipe");
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);

  Compute cx(a.threads);
  std::optional<Model> model;  // outlives the server, whose job threads use it until joined
  Server server(cx, options);
  const int port = server.bind();
  std::printf("klein serve: listening on http://%s:%d (%d threads)\n", options.host.c_str(), port,
              cx.threads());
  if (options.safety.on())
    std::printf("klein serve: safety checks on (threshold %g, %s)\n", options.safety.threshold,
                safety_action_name(options.safety.action));
  else
    std::printf("klein serve: safety checks off\n");
  if (options.check_prompt)
    std::printf("klein serve: prompt checks on (BFL's, by the model's text encoder)\n");
  if (options.tiny.on())
    std::printf("klein serve: previews by the tiny decoder %s (requests may ask \"decoder\": "
                "\"tiny\")\n", options.tiny.model->path().string().c_str());
  std::fflush(stdout);
  std::thread waiter([&] {
    unsigned char signal = 0;
    while (::read(g_signal_pipe[0], &signal, 1) < 0 && errno == EINTR) {
    }
    if (signal != 0)
      std::fprintf(stderr, "klein serve: %s, stopping\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
    server.stop();
  });
  std::thread http([&] { server.run(); });

  std::exception_ptr failed;
  try {
    model.emplace(Model::open(a.model));
    check_tiny_decoder(options.tiny, model->weights->config());
    if (options.check_prompt) {
      const std::string why = prompt_check_unavailable(*model);
      check(why.empty(), "--check-prompt: ", why);
    }
    server.set_model(*model);
    std::printf("klein serve: %s ready\n", model->name.c_str());
    std::fflush(stdout);
  } catch (...) {
    failed = std::current_exception();
    const unsigned char none = 0;  // wakes the waiter, which stops the server
    [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &none, 1);
  }
  // run() returns after stop(), which only the waiter calls.
  http.join();
  waiter.join();
  if (failed) std::rethrow_exception(failed);
}

Registration serve_command("serve", 85, [](CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand(
      "serve", "Serve the model over HTTP: OpenAI images API and the AUTOMATIC1111 API");
  add_model_options(*cmd, a->model);
  cmd->add_option("--host", a->server.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->server.port, "Port (0: any free port, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--api-key", a->server.api_key,
                  "Require \"Authorization: Bearer KEY\" on every request but /health and "
                  "/metrics");
  cmd->add_option("--max-queue", a->server.max_queue,
                  "Requests that may wait behind the running one; more get 429")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd->add_option("--max-side", a->server.max_side, "Largest width or height a request may ask")
      ->check(CLI::Range(int64_t(16), int64_t(8192)))
      ->capture_default_str();
  cmd->add_option("--max-images", a->server.max_images, "Most images per request")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--job-ttl", a->server.job_ttl_seconds,
                  "Seconds a finished job (POST /v1/jobs) is kept for its client to collect")
      ->check(CLI::Range(1.0, 7.0 * 24 * 3600))
      ->capture_default_str();
  cmd->add_option("--max-jobs", a->server.max_jobs,
                  "Jobs kept at once, in any state; the oldest finished one makes room")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "Worker threads (default: the usable CPUs)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--lora-dir", a->server.lora_dir,
                  "LoRAs requests may use: DIR/NAME.safetensors as <lora:NAME:SCALE> in the "
                  "prompt (listed at /sdapi/v1/loras)")
      ->check(CLI::ExistingDirectory);
  add_upsample_options(*cmd, a->upsample, "upsample-");
  cmd->add_flag("--check-prompt", a->server.check_prompt,
                "Check every request's prompt as `klein generate --check-prompt` does (BFL's "
                "prompt check by the text encoder, which must keep its language-model head); a "
                "flagged prompt gets 422 and no work is done");
  cmd->add_option("--tiny-vae", a->tiny_vae,
                  "A tiny autoencoder's decoder (taef2_decoder.pth for FLUX.2, taef1_decoder.pth "
                  "for Z-Image): the step previews are its pictures, and requests may ask "
                  "\"decoder\": \"tiny\"")
      ->type_name("FILE");
  cmd->add_option("--controlnet", a->server.controlnet,
                  "Z-Image: the control model (Z-Image-Turbo-Fun-Controlnet-Union 2.1, a diffusers "
                  "directory or the original .safetensors) that requests with a \"control_image\" "
                  "use")
      ->check(CLI::ExistingPath);
  cmd->add_option("--safety-model", a->safety_model,
                  "The safety classifier's Hugging Face directory (Falconsai/nsfw_image_detection; "
                  "default $KLEIN_SAFETY_MODEL): with one, every request's input and generated "
                  "images are checked (a flagged one gets 422), and no request can turn it off")
      ->type_name("DIR");
  cmd->add_flag("--no-safety", a->no_safety,
                "No safety checks, even when $KLEIN_SAFETY_MODEL names a classifier");
  cmd->add_option_function<double>(
         "--safety-threshold", [a](double t) { a->safety_threshold = t; },
         "Flag an image when its nsfw probability is strictly above this, in [0, 1] "
         "(default 0.85, BFL's)")
      ->type_name("P");
  cmd->add_option_function<std::string>(
         "--safety-action", [a](const std::string& s) { a->safety_action = s; },
         "What a flagged generated image gets: refuse (422, no image; the default) or blur (a "
         "strongly blurred image, its metadata saying why)")
      ->type_name("refuse|blur");
  add_precision_option(*cmd, a->server.precision);
  add_memory_options(*cmd, a->memory);
  cmd->callback([a] { serve(*a); });
});

}  // namespace
}  // namespace klein::cli
