// klein check-prompt: the prompt check of BFL's FLUX.2 reference (pipeline/prompt_check.h) on
// the model's own text encoder, run as a language model. `klein generate --check-prompt` and
// `klein serve --check-prompt` make the same check before any image work.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "cli/upsample_options.h"
#include "core/error.h"
#include "ops/compute.h"
#include "models/qwen3/prompt_cache.h"
#include "pipeline/prompt_check.h"

namespace klein::cli {
namespace {

struct CheckPromptArgs {
  ModelPaths model;
  std::vector<std::string> prompts;
  MemoryOptions memory;
  int threads = 0;
  bool json = false;
  bool no_cache = false;
  std::string cache_dir;
};

void run_check_prompt(const CheckPromptArgs& a) {
  check(!a.prompts.empty(), "check-prompt: give the prompt with -p (more than one: -p A -p B)");
  Model model = open_language_model(a.model, a.memory, prompt_check_unavailable);
  Compute cx(a.threads);
  std::optional<std::filesystem::path> cache_dir;
  if (!a.no_cache) cache_dir = a.cache_dir.empty() ? qwen3::PromptCache::default_dir()
                                                   : std::filesystem::path(a.cache_dir);
  PromptChecker checker(model, cx, cache_dir);
  bool any_flagged = false;
  for (const std::string& prompt : a.prompts) {
    const PromptCheck c = checker.check(prompt);
    if (!c.store_error.empty()) std::fprintf(stderr, "warning: prompt cache: %s\n", c.store_error.c_str());
    any_flagged = any_flagged || c.flagged;
    if (a.json) {
      const nlohmann::ordered_json j = {{"prompt", prompt},         {"flagged", c.flagged},
                                        {"yes_logit", c.yes_logit}, {"no_logit", c.no_logit},
                                        {"chat_tokens", c.chat_tokens},
                                        {"reused_tokens", c.reused_tokens},
                                        {"reused_from_cache", c.prefix_from_cache},
                                        {"seconds", c.seconds}};
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s: %s (yes %.4f, no %.4f; %d tokens, %d of them kept%s, in %.1f s)\n",
                  c.flagged ? "FLAGGED" : "passed", prompt.c_str(), double(c.yes_logit),
                  double(c.no_logit), c.chat_tokens, c.reused_tokens,
                  c.prefix_from_cache ? " in the prompt cache" : "", c.seconds);
    }
  }
  std::fflush(stdout);
  if (any_flagged) throw CLI::RuntimeError(kExitFlagged);
}

}  // namespace

static Registration check_prompt_command("check-prompt", 36, [](CLI::App& app) {
  auto a = std::make_shared<CheckPromptArgs>();
  CLI::App* cmd = app.add_subcommand(
      "check-prompt",
      "Ask the model's text encoder, as BFL's FLUX.2 reference asks Mistral, whether a prompt "
      "names copyrighted characters, brands or living public figures (exit 0: none flagged, "
      "2: some prompt flagged, 1: error)");
  add_model_options(*cmd, a->model);
  for (const char* unused : {"--diffusion-model", "--vae"})
    cmd->get_option(unused)->description("not read: the check runs the text encoder alone");
  cmd->add_option("-p,--prompt", a->prompts, "a prompt to check (repeat for more)");
  add_memory_options(*cmd, a->memory);
  cmd->add_option("--threads", a->threads, "worker threads (default: all)");
  cmd->add_flag("--json", a->json, "one JSON object per prompt, one per line");
  cmd->add_flag("--no-cache", a->no_cache,
                "compute the keys and values of BFL's fixed text (most of a check) instead of "
                "reading them from the prompt cache, and store nothing");
  cmd->add_option("--cache-dir", a->cache_dir,
                  "the prompt cache's directory (default: $XDG_CACHE_HOME/klein/prompts or "
                  "~/.cache/klein/prompts)");
  cmd->callback([a] { run_check_prompt(*a); });
});

}  // namespace klein::cli
