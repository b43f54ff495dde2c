// klein synth: writes a full-size synthetic FLUX.2-klein-4B checkpoint (random weights, real
// names, shapes, dtypes and layout) for speed and memory measurements.
#include <unistd.h>

#include <cstdio>

#include "cli/commands.h"
#include "bench/support/synthetic.h"

namespace klein::cli {
namespace {

Registration reg("synth", 90, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a synthetic model (random weights, exact layout) for benchmarks");
  struct Args {
    std::string out, tokenizer;
    uint64_t seed = 0;
    std::string variant = "4b";
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-o,--output", args->out, "Directory to create (about 16 GB)")->required();
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Directory with the Qwen3 tokenizer files to copy (vocab.json, merges.txt, "
                  "tokenizer_config.json; or tokenizer.json)")
      ->required();
  cmd->add_option("--seed", args->seed, "Seed of the random weights");
  cmd->add_option("--variant", args->variant,
                  "4b: FLUX.2-klein-4B (distilled); 4b-base: its base model (50 steps, CFG); "
                  "4b-kv: the 4B declared for the reference K/V cache pipeline; 9b, 9b-base, "
                  "9b-kv: FLUX.2-klein-9B (Qwen3-8B; about 36 GB) likewise; zimage-turbo: "
                  "Z-Image-Turbo (6B, Qwen3-4B, FLUX.1 VAE; about 20 GB)")
      ->check(CLI::IsMember({"4b", "4b-base", "4b-kv", "9b", "9b-base", "9b-kv", "zimage-turbo"}))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "No progress output");
  cmd->callback([args] {
    SyntheticModelOptions o;
    o.out_dir = args->out;
    o.tokenizer_dir = args->tokenizer;
    o.seed = args->seed;
    o.config = klein_variant_config(args->variant);
    int last_percent = -1;
    // On a terminal one line rewritten in place; into a file or pipe a line per 10 %.
    const bool terminal = ::isatty(::fileno(stderr)) == 1;
    write_synthetic_model(o, [&](const std::string& file, uint64_t done, uint64_t total) {
      const int percent = int(100 * done / std::max<uint64_t>(total, 1));
      if (args->quiet || percent == last_percent || (!terminal && percent % 10 != 0)) return;
      last_percent = percent;
      std::fprintf(stderr, "%ssynth: %3d%%  %.1f / %.1f GB  %-40s%s", terminal ? "\r" : "",
                   percent, double(done) / 1e9, double(total) / 1e9, file.c_str(),
                   terminal ? "" : "\n");
      std::fflush(stderr);
    });
    if (!args->quiet && terminal) std::fprintf(stderr, "\n");
    std::printf("wrote %s\n", args->out.c_str());
  });
});

}  // namespace
}  // namespace klein::cli
