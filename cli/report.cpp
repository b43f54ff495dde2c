// klein report: what quantization costs, per tensor and in the final image. Parses the
// options, shows progress and prints; the measurements and writers are convert/report.
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/error.h"
#include "core/files.h"
#include "convert/report/report.h"
#include "convert/report/writers.h"
#include "pipeline/tiny_decoder.h"

namespace klein::cli {
namespace {

struct ReportArgs {
  report::ReportOptions options;
  std::string output;
  std::string blocks = "both";
  std::string policy_out;
  std::string max_size;
  double target_psnr = 0;
  bool no_e2e = false, json = false, quiet = false;
  size_t worst = 15;
  std::string decoder = "full", tiny_vae;
};

// One line per phase on stderr, rewritten in place while it runs.
class TerminalProgress final : public Progress {
 public:
  explicit TerminalProgress(bool quiet) : quiet_(quiet) {}
  void begin(const std::string& phase, int) override {
    if (!quiet_) std::fprintf(stderr, "%s...", phase.c_str());
  }
  void step(const std::string& phase, int done, int total) override {
    if (!quiet_) std::fprintf(stderr, "\r%s: %d/%d   ", phase.c_str(), done, total);
  }
  void end(const std::string& phase, double seconds) override {
    if (!quiet_) std::fprintf(stderr, "\r%s: %.2f s%20s\n", phase.c_str(), seconds, "");
  }
  void warn(const std::string& message) override {
    std::fprintf(stderr, "\nwarning: %s\n", message.c_str());
  }

 private:
  bool quiet_;
};

void run_report(ReportArgs& a) {
  report::ReportOptions& o = a.options;
  o.e2e = !a.no_e2e;
  o.blocks = report::parse_block_probes(a.blocks);
  if (a.target_psnr > 0 || !a.max_size.empty()) {
    report::PolicyGoal goal;
    if (a.target_psnr > 0) goal.min_psnr_db = a.target_psnr;
    if (!a.max_size.empty()) goal.max_bytes = report::parse_size(a.max_size, "--max-size");
    check(!a.output.empty() || !a.policy_out.empty(),
          "--target-psnr/--max-size: give -o DIR or --policy-out FILE for the proposed policy");
    o.goal = goal;
  }
  check(a.decoder == "full" || a.decoder == "tiny", "--decoder ", a.decoder,
        ": expected full (the model's VAE alone) or tiny (the tiny decoder against it too)");
  check(a.decoder == "full" || !a.tiny_vae.empty(),
        "--decoder tiny needs the tiny decoder: --tiny-vae FILE (taef2_decoder.pth for FLUX.2, "
        "taef1_decoder.pth for Z-Image)");
  if (!a.tiny_vae.empty()) o.tiny.model = open_shared_tiny_decoder(a.tiny_vae, "--tiny-vae");
  TerminalProgress progress(a.quiet);
  const report::Report r = report::build_report(o, progress);

  if (!a.output.empty()) {
    const auto files = report::write_report(r, a.output);
    if (!a.quiet) std::fprintf(stderr, "wrote %zu files into %s\n", files.size(), a.output.c_str());
  }
  if (r.policy && !a.policy_out.empty()) {
    AtomicFile f(a.policy_out);
    f.write(r.policy->text);
    f.commit();
    if (!a.quiet) std::fprintf(stderr, "wrote the policy to %s\n", a.policy_out.c_str());
  }
  if (a.json)
    std::printf("%s\n", report::report_json(r).dump(1).c_str());
  else
    std::printf("%s", report::report_table(r, a.worst).c_str());
}

Registration report_command("report", 15, [](CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Quantization error of a container against its reference, per tensor and in "
                "the final image; optionally a precision policy for an error or size budget");
  add_model_options(*cmd, a->options.reference);
  cmd->add_option("--candidate", a->options.candidate, "the klein container to measure")
      ->required();
  cmd->add_option("-o,--output", a->output,
                  "directory for report.html, report.json, *.csv, the images and policy.txt");
  cmd->add_flag("--json", a->json, "print the report as JSON instead of the table");
  cmd->add_option("--worst", a->worst, "tensors in the table's worst list")->capture_default_str();

  const char* e2e = "End to end";
  cmd->add_flag("--no-e2e", a->no_e2e, "compare the weights only")->group(e2e);
  cmd->add_option("--decoder", a->decoder,
                  "tiny: also decode each case's final latents with the tiny decoder of "
                  "--tiny-vae and give its PSNR and SSIM against the full decoder's image (what "
                  "klein generate --decoder tiny trades for its speed)")
      ->default_val("full")
      ->group(e2e);
  cmd->add_option("--tiny-vae", a->tiny_vae, "the tiny decoder (taef2_decoder.pth for FLUX.2, "
                  "taef1_decoder.pth for Z-Image); implies --decoder tiny")
      ->type_name("FILE")
      ->group(e2e);
  cmd->add_option("-p,--prompt", a->options.prompts,
                  "prompt of a generation to compare (repeatable; default: two built-in ones)")
      ->group(e2e);
  cmd->add_option("--seed", a->options.seeds,
                  "seed per prompt, in order (repeatable; the last one repeats)")
      ->group(e2e);
  cmd->add_option("-W,--width", a->options.width,
                  "width in pixels (default 256; 64 for test-sized models)")
      ->group(e2e);
  cmd->add_option("-H,--height", a->options.height, "height in pixels (default as the width)")
      ->group(e2e);
  cmd->add_option("-s,--steps", a->options.steps, "denoising steps (default: the model's)")
      ->group(e2e);
  cmd->add_option("--blocks", a->blocks,
                  "transformer block probes: accumulated (one forward), isolated (one forward "
                  "per unit, each block on the reference's activations), both or none")
      ->capture_default_str()
      ->group(e2e);
  add_precision_option(*cmd, a->options.precision);
  cmd->add_option("--probe-step", a->options.probe_step,
                  "step of the first case whose inputs the block probes use")
      ->capture_default_str()
      ->group(e2e);

  const char* search = "Policy search";
  cmd->add_option("--target-psnr", a->target_psnr,
                  "propose a policy whose predicted image PSNR against the reference is at "
                  "least this (dB)")
      ->group(search);
  cmd->add_option("--max-size", a->max_size,
                  "propose a policy whose container is at most this size (e.g. 2.5GB, 900MB)")
      ->group(search);
  cmd->add_option("--verify-rounds", a->options.verify_rounds,
                  "convert and measure up to this many proposals, refining the sensitivities "
                  "after each (0: predict only)")
      ->capture_default_str()
      ->group(search);
  cmd->add_option("--policy-out", a->policy_out,
                  "write the proposed policy here (default: policy.txt in -o)")
      ->group(search);
  cmd->add_option("--threads", a->options.threads, "worker threads (default: all)");
  cmd->add_flag("-q,--quiet", a->quiet, "no progress output");
  cmd->callback([a] { run_report(*a); });
});

}  // namespace
}  // namespace klein::cli
