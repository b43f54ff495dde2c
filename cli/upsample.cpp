// klein upsample: a short prompt -> the detailed one the model's own text encoder writes as a
// chat model (pipeline/upsample.h). Also the options `klein generate --upsample` shares.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "cli/upsample_options.h"
#include "core/error.h"
#include "core/files.h"
#include "core/memory.h"
#include "ops/compute.h"
#include "pipeline/memory_plan.h"
#include "pipeline/noise.h"
#include "pipeline/stages.h"
#include "pipeline/upsample.h"

namespace klein::cli {

UpsampleOptions UpsampleArgs::options(const std::string& prefix) const {
  UpsampleOptions o;
  if (!system_file.empty()) {
    o.system = read_text_file(system_file);
    check(!o.system.empty(), "--", prefix, "system ", system_file, ": the file is empty");
  }
  o.edit = edit;
  o.max_new_tokens = max_tokens;
  o.temperature = temperature;
  o.top_p = top_p;
  o.top_k = top_k;
  o.seeded = seed.has_value();
  check(!temperature || (*temperature >= 0 && *temperature <= 10), "--", prefix,
        "temperature: expected 0 (greedy) to 10, got ", temperature.value_or(0));
  check(!top_p || (*top_p > 0 && *top_p <= 1), "--", prefix,
        "top-p: expected a number above 0 and at most 1, got ", top_p.value_or(0));
  check(!top_k || *top_k >= 0, "--", prefix, "top-k: expected 0 (off) or more, got ",
        top_k.value_or(0));
  check(max_tokens >= 1 && max_tokens <= 4096, "--", prefix,
        "max-tokens: expected 1 to 4096, got ", max_tokens);
  o.seed = seed.value_or(random_seed());
  return o;
}

std::optional<hub::ChatEndpoint> UpsampleArgs::remote(const UpsampleOptions& o) const {
  check(!endpoint.empty() || (remote_model.empty() && !key_env && !strict),
        "--upsample-model, --upsample-key-env and --upsample-strict need --upsample-endpoint URL");
  if (endpoint.empty()) return std::nullopt;
  hub::ChatEndpoint e;
  e.url = endpoint;
  hub::completions_url(endpoint, "--upsample-endpoint");  // checked now, before any work
  e.model = remote_model;
  const std::string var = key_env.value_or("OPENAI_API_KEY");
  check(!var.empty(), "--upsample-key-env: expected the name of an environment variable");
  const char* key = std::getenv(var.c_str());
  check(!key_env || (key && *key), "--upsample-key-env ", var,
        ": the environment variable is not set (it holds the service's API key)");
  if (key) e.key = key;
  check(timeout > 0 && timeout <= 3600, "--upsample-timeout: expected more than 0 and at most "
        "3600 seconds, got ", timeout);
  e.timeout_seconds = timeout;
  e.max_tokens = o.max_new_tokens;
  if (o.temperature) e.temperature = *o.temperature;
  return e;
}

hub::RemoteUpsample upsample_remotely(const hub::ChatEndpoint& endpoint, const UpsampleArgs& a,
                                      const UpsampleOptions& o, const std::string& prompt,
                                      const std::vector<std::filesystem::path>& images) {
  std::vector<hub::ChatImage> sent;
  for (const auto& path : images) {
    std::string ext = path.extension().string();
    for (char& c : ext) c = char(std::tolower(static_cast<unsigned char>(c)));
    const std::string mime = ext == ".png" ? "image/png" : ext == ".webp" ? "image/webp"
                                                                         : "image/jpeg";
    sent.push_back({mime, read_text_file(path)});
  }
  return hub::remote_upsample(endpoint, upsample_system(o, UpsampleStyle{}), prompt, sent,
                              a.strict);
}

Model open_language_model(const ModelPaths& paths, const MemoryOptions& memory,
                          std::string (*unavailable)(const Model&)) {
  const std::optional<uint64_t> budget = memory.budget();  // a bad size fails first
  Model model = open_upsample_model(paths);
  const std::string why = unavailable(model);
  check(why.empty(), why);
  MemoryPlanInputs need = stages_for(model.weights->config()).memory_inputs(model.weights->config());
  need.image = false;
  const MemoryPlan plan = plan_memory(estimate_memory(*model.weights, need), budget,
                                      available_memory_bytes(), memory.forced());
  model.weights->set_residency(plan.residency);
  return model;
}

void add_upsample_options(CLI::App& cmd, UpsampleArgs& a, const std::string& prefix) {
  const std::string p = "--" + prefix;
  cmd.add_option(p + "system", a.system_file,
                 "a file with the system message to use instead of ours (README: what ours "
                 "ask for)");
  cmd.add_option(p + "max-tokens", a.max_tokens, "most tokens the rewrite may have")
      ->capture_default_str();
  cmd.add_option(p + "temperature", a.temperature,
                 "sampling temperature, 0 for greedy decoding (default: greedy, or 0.6 when "
                 "another sampling option is given; FLUX.2-dev samples at 0.15 as its pipeline "
                 "does)");
  cmd.add_option(p + "top-p", a.top_p, "sampling: nucleus mass kept (default 0.95; dev 1)");
  cmd.add_option(p + "top-k", a.top_k, "sampling: most probable tokens kept, 0 for all "
                                       "(default 20; dev 50)");
  cmd.add_option(p + "seed", a.seed, "sampling: seed of the draw (default: random)");
  cmd.add_option("--upsample-endpoint", a.endpoint,
                 "upsample with a remote model instead: an OpenAI-compatible chat completions "
                 "API (llama.cpp's server, vLLM, OpenRouter: e.g. http://127.0.0.1:8080/v1); "
                 "when it fails the prompt is used as given, with a warning")
      ->type_name("URL");
  cmd.add_option("--upsample-model", a.remote_model, "the remote model's name (the request's "
                 "\"model\"; default: none, for a server with one model)");
  cmd.add_option_function<std::string>(
      "--upsample-key-env", [&a](const std::string& v) { a.key_env = v; },
      "the environment variable holding the remote service's API key (default OPENAI_API_KEY "
      "when set; the key is never printed or stored)")
      ->type_name("VAR");
  cmd.add_option("--upsample-timeout", a.timeout, "seconds the remote model has to answer")
      ->capture_default_str();
  cmd.add_flag("--upsample-strict", a.strict,
               "a failure of the remote model is an error instead of a fallback to the prompt");
}

namespace {

struct UpsampleCommand {
  ModelPaths model;
  std::string prompt;
  UpsampleArgs args;
  MemoryOptions memory;
  int threads = 0;
  bool json = false;
  bool quiet = false;
};

void run_upsample(const UpsampleCommand& a) {
  check(!a.prompt.empty(), "upsample: give the prompt with -p");
  const UpsampleOptions o = a.args.options("");
  if (const std::optional<hub::ChatEndpoint> remote = a.args.remote(o)) {
    const hub::RemoteUpsample r = upsample_remotely(*remote, a.args, o, a.prompt);
    if (a.json) {
      nlohmann::json j = {{"prompt", r.prompt}, {"original_prompt", a.prompt},
                          {"remote", true}, {"fell_back", r.fell_back}, {"seconds", r.seconds}};
      if (r.fell_back) j["warning"] = r.warning;
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    if (r.fell_back) std::fprintf(stderr, "warning: %s\n", r.warning.c_str());
    std::printf("%s\n", r.prompt.c_str());
    if (!a.quiet && !r.fell_back)
      std::fprintf(stderr, "rewritten by the remote model in %.1f s\n", r.seconds);
    return;
  }
  Model model = open_language_model(a.model, a.memory, upsample_unavailable);
  Compute cx(a.threads);
  const auto start = std::chrono::steady_clock::now();
  const bool tty = !a.quiet && !a.json && ::isatty(STDERR_FILENO);
  const UpsampleResult r = upsample_prompt(model, cx, a.prompt, o, [&](int n) {
    if (tty) std::fprintf(stderr, "\rupsampling: %d tokens", n);
  });
  if (tty) std::fprintf(stderr, "\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double decode_rate = r.decode_seconds > 0 && r.new_tokens > 1
                                 ? double(r.new_tokens - 1) / r.decode_seconds
                                 : 0;
  if (a.json) {
    nlohmann::json j = {{"prompt", r.prompt},
                        {"original_prompt", a.prompt},
                        {"prompt_tokens", r.prompt_tokens},
                        {"new_tokens", r.new_tokens},
                        {"finished", r.stopped},
                        {"prefill_seconds", r.prefill_seconds},
                        {"decode_seconds", r.decode_seconds},
                        {"decode_tokens_per_second", decode_rate},
                        {"sampling", r.sampled},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    if (r.sampled) j["seed"] = o.seed;
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  std::printf("%s\n", r.prompt.c_str());
  if (!a.quiet) {
    std::fprintf(stderr,
                 "%d prompt tokens in %.1f s, %d new tokens in %.1f s (%.1f tokens/s)%s; %.1f s "
                 "in all, peak RSS %.0f MiB%s\n",
                 r.prompt_tokens, r.prefill_seconds, r.new_tokens, r.decode_seconds, decode_rate,
                 r.stopped ? "" : ", cut at the token limit", seconds,
                 double(peak_rss_bytes()) / (1 << 20),
                 r.sampled ? (", seed " + std::to_string(o.seed)).c_str() : "");
  }
}

}  // namespace

static Registration upsample_command("upsample", 35, [](CLI::App& app) {
  auto a = std::make_shared<UpsampleCommand>();
  CLI::App* cmd = app.add_subcommand(
      "upsample",
      "Rewrite a short prompt into a detailed one with the model's text encoder (-m DIR, or "
      "--text-encoder FILE --tokenizer DIR: no transformer or VAE needed)");
  add_model_options(*cmd, a->model);
  // Upsampling runs the text encoder alone: the other parts of a model are not read.
  for (const char* unused : {"--diffusion-model", "--vae"})
    cmd->get_option(unused)->description("not read: upsampling runs the text encoder alone");
  cmd->add_option("-p,--prompt", a->prompt, "the prompt to rewrite");
  cmd->add_flag("--edit", a->args.edit,
                "the prompt is an instruction to edit reference images (another system message)");
  add_upsample_options(*cmd, a->args, "");
  add_memory_options(*cmd, a->memory);
  cmd->add_option("--threads", a->threads, "worker threads (default: all)");
  cmd->add_flag("--json", a->json, "the result and timings as JSON on stdout");
  cmd->add_flag("-q,--quiet", a->quiet, "only the rewritten prompt");
  cmd->callback([a] { run_upsample(*a); });
});

}  // namespace klein::cli
