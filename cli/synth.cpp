// klein synth: writes a full-size synthetic checkpoint (random weights, real names, shapes,
// dtypes and layout) for speed and memory measurements: a diffusers directory of BF16 files,
// or with -t a container converted straight from weights made in memory (for FLUX.2-dev,
// whose BF16 files would not fit on most disks).
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "bench/support/synthetic.h"
#include "cli/commands.h"
#include "convert/convert.h"
#include "convert/policy.h"
#include "weights/family.h"

namespace klein::cli {
namespace {

Registration synth_command("synth", 90, [](CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "synth", "Write a synthetic model (random weights, exact layout) for benchmarks");
  struct Args {
    std::string out, tokenizer;
    uint64_t seed = 0;
    std::string variant = "4b";
    std::string type;
    int threads = 0;
    bool quiet = false;
  };
  auto args = std::make_shared<Args>();
  cmd->add_option("-o,--output", args->out,
                  "Directory to create (about 16 GB for the 4B), or with -t the container file")
      ->required();
  cmd->add_option("-t,--type", args->type,
                  "Write a container of this storage type (q4, q8, bf16, ...; as klein "
                  "convert -t) straight from weights made in memory a unit at a time, without "
                  "the BF16 files (FLUX.2-dev's would be about 100 GB)");
  cmd->add_option("--threads", args->threads, "threads making and packing the weights (-t)");
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Directory with the tokenizer files to copy (or, with -t, to store): "
                  "vocab.json, merges.txt, tokenizer_config.json, or tokenizer.json")
      ->required();
  cmd->add_option("--seed", args->seed, "Seed of the random weights");
  std::string models;
  std::vector<std::string> names;
  for (const ModelFamily* f : model_families())
    for (const auto& m : f->published_models()) {
      models += (models.empty() ? "" : "; ") + m.name + ": " + m.about;
      names.push_back(m.name);
    }
  cmd->add_option("--variant", args->variant, "The published model whose shapes to make: " + models)
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", args->quiet, "No progress output");
  cmd->callback([args] {
    if (!args->type.empty()) {
      // Straight into a container: the conversion's own code on a store of made-up weights.
      convert::ConvertOptions c;
      c.output = args->out;
      c.target = convert::parse_storage_type(args->type, "-t");
      c.source.tokenizer = args->tokenizer;
      c.threads = args->threads;
      ModelConfig config = klein_variant_config(args->variant);
      config.name = "synthetic-" + args->variant;
      SyntheticStore store(std::move(config), args->seed,
                           args->threads > 0 ? args->threads
                                             : int(std::thread::hardware_concurrency()));
      c.store = &store;
      if (!args->quiet) {
        c.stage = [](const std::string& s) { std::fprintf(stderr, "synth: %s\n", s.c_str()); };
        c.progress = [](const convert::ConvertProgress& p) {
          std::fprintf(stderr, "synth: [%3zu/%zu] %-28s wrote %.2f GB  %.0f s\n", p.unit,
                       p.units, p.name.c_str(), double(p.written_bytes) / 1e9, p.seconds);
        };
      }
      const convert::ConvertSummary sum = convert::convert_model(c);
      std::printf("wrote %s (%.2f GB, %zu units, %zu tensors)\n", args->out.c_str(),
                  double(sum.file_bytes) / 1e9, sum.units, sum.tensors);
      return;
    }
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
