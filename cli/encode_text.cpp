// klein encode-text: a prompt -> the text-encoder context the transformer attends to, saved as
// .npy float32 [1, text tokens, context width] (the pipeline's prompt_embeds), as the model's
// family encodes its prompts (FamilyStages::encode_text). Parses the options, calls the
// family's text conditioning with the prompt cache, and prints what happened.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "core/memory.h"
#include "core/npy.h"
#include "ops/compute.h"
#include "models/qwen3/prompt_cache.h"
#include "models/qwen3/text_encoder.h"
#include "pipeline/memory_plan.h"
#include "pipeline/model_tokenizer.h"
#include "pipeline/stages.h"
#include "weights/model_source.h"

namespace klein::cli {
namespace {

struct EncodeTextOptions {
  ModelPaths paths;
  std::string prompt;
  std::filesystem::path output;
  bool no_cache = false;
  std::filesystem::path cache_dir;
  int threads = 0;
  MemoryOptions memory;
  bool verbose = false;
};

void run_encode_text(const EncodeTextOptions& o) {
  const std::optional<uint64_t> budget = o.memory.budget();
  const auto start = std::chrono::steady_clock::now();
  auto store = open_model(o.paths);
  const FamilyStages& family = stages_for(store->config());
  MemoryPlanInputs need = family.memory_inputs(store->config());
  need.image = false;
  const MemoryPlan plan = plan_memory(estimate_memory(*store, need), budget,
                                      available_memory_bytes(), o.memory.forced());
  store->set_residency(plan.residency);
  if (o.verbose) std::fprintf(stderr, "memory: %s\n", plan.reason.c_str());
  const Tokenizer tokenizer = load_model_tokenizer(o.paths, store.get());

  Compute cx(o.threads);
  qwen3::TextEncoder encoder(*store, cx);
  std::optional<qwen3::PromptCache> cache;
  if (!o.no_cache)
    cache.emplace(o.cache_dir.empty() ? qwen3::PromptCache::default_dir() : o.cache_dir);
  EncodedText result = family.encode_text(encoder, tokenizer, o.prompt, cache ? &*cache : nullptr);
  const PromptTokens& tokens = result.tokens;
  if (!tokens.warning.empty()) std::fprintf(stderr, "warning: %s\n", tokens.warning.c_str());
  if (!result.store_error.empty())
    std::fprintf(stderr, "warning: the context was not cached: %s\n", result.store_error.c_str());

  Tensor& context = result.context;
  context.reshape({1, context.dim(0), context.dim(1)});  // batch of one, as the pipeline has it
  write_npy(o.output, context);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: context %s from %d prompt tokens + %d padding, %s in %.2f s\n",
              o.output.string().c_str(), shape_str(context.shape()).c_str(), tokens.real_tokens,
              int(context.dim(1)) - tokens.real_tokens,
              result.from_cache ? "read from the prompt cache" : "encoded", seconds);
  if (o.verbose)
    std::fprintf(stderr, "peak RSS %s, at most %zu weight unit%s (%s) resident at once\n",
                 format_bytes(peak_rss_bytes()).c_str(), store->residency_stats().peak_units,
                 store->residency_stats().peak_units == 1 ? "" : "s",
                 format_bytes(store->residency_stats().peak_bytes).c_str());
}

}  // namespace

static Registration encode_text_command("encode-text", 40, [](CLI::App& app) {
  auto options = std::make_shared<EncodeTextOptions>();
  CLI::App* cmd = app.add_subcommand(
      "encode-text", "Encode a prompt with the text encoder and save the context as .npy");
  add_model_options(*cmd, options->paths);
  cmd->add_option("-p,--prompt", options->prompt, "the prompt text")->required();
  cmd->add_option("-o,--output", options->output,
                  "output .npy file: float32 [1, text tokens, context width], the context the "
                  "model's pipeline gives its transformer (FLUX.2: [1, 512, 3 x text hidden "
                  "size]; Z-Image: the prompt's tokens only, [1, tokens, text hidden size])")
      ->required();
  cmd->add_flag("--no-cache", options->no_cache,
                "always run the text encoder; neither read nor write the prompt cache");
  cmd->add_option("--cache-dir", options->cache_dir,
                  "prompt cache directory (default: $XDG_CACHE_HOME/klein/prompts, else "
                  "~/.cache/klein/prompts)");
  cmd->add_option("--threads", options->threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  add_memory_options(*cmd, options->memory);
  cmd->add_flag("-v,--verbose", options->verbose, "the memory decision and the peak RSS");
  cmd->callback([options] { run_encode_text(*options); });
});

}  // namespace klein::cli
