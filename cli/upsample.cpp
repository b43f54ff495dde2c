// klein upsample: a short prompt -> the detailed one the model's own text encoder writes as a
// chat model (pipeline/upsample.h). Also the options `klein generate --upsample` shares.
#include <unistd.h>

#include <chrono>
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
  o.sampling.sample = temperature || top_p || top_k || seed;
  o.sampling.temperature = temperature.value_or(0.6f);
  o.sampling.top_p = top_p.value_or(0.95f);
  o.sampling.top_k = top_k.value_or(20);
  check(o.sampling.temperature > 0 && o.sampling.temperature <= 10, "--", prefix,
        "temperature: expected a number above 0 and at most 10, got ", o.sampling.temperature);
  check(o.sampling.top_p > 0 && o.sampling.top_p <= 1, "--", prefix,
        "top-p: expected a number above 0 and at most 1, got ", o.sampling.top_p);
  check(o.sampling.top_k >= 0, "--", prefix, "top-k: expected 0 (off) or more, got ",
        o.sampling.top_k);
  check(max_tokens >= 1 && max_tokens <= 4096, "--", prefix,
        "max-tokens: expected 1 to 4096, got ", max_tokens);
  o.seed = seed.value_or(random_seed());
  return o;
}

void add_upsample_options(CLI::App& cmd, UpsampleArgs& a, const std::string& prefix) {
  const std::string p = "--" + prefix;
  cmd.add_option(p + "system", a.system_file,
                 "a file with the system message to use instead of ours (README: what ours "
                 "ask for)");
  cmd.add_option(p + "max-tokens", a.max_tokens, "most tokens the rewrite may have")
      ->capture_default_str();
  cmd.add_option(p + "temperature", a.temperature,
                 "sample instead of greedy decoding, at this temperature (default 0.6 when "
                 "another sampling option is given)");
  cmd.add_option(p + "top-p", a.top_p, "sampling: nucleus mass kept (default 0.95)");
  cmd.add_option(p + "top-k", a.top_k, "sampling: most probable tokens kept, 0 for all "
                                       "(default 20)");
  cmd.add_option(p + "seed", a.seed, "sampling: seed of the draw (default: random)");
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
  const std::optional<uint64_t> budget = a.memory.budget();
  Model model = open_upsample_model(a.model);
  const std::string why = upsample_unavailable(model);
  check(why.empty(), why);
  MemoryPlanInputs need = stages_for(model.weights->config()).memory_inputs(model.weights->config());
  need.image = false;
  const MemoryPlan plan = plan_memory(estimate_memory(*model.weights, need), budget,
                                      available_memory_bytes(), a.memory.forced());
  model.weights->set_residency(plan.residency);
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
                        {"sampling", o.sampling.sample},
                        {"peak_rss_bytes", peak_rss_bytes()}};
    if (o.sampling.sample) j["seed"] = o.seed;
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
                 o.sampling.sample ? (", seed " + std::to_string(o.seed)).c_str() : "");
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
