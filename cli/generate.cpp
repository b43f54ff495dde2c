// klein generate: text-to-image and editing with reference images.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/upsample_options.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/files.h"
#include "core/parse.h"
#include "core/memory.h"
#include "formats/image/image.h"
#include "models/qwen3/prompt_cache.h"
#include "pipeline/noise.h"
#include "pipeline/pipeline.h"
#include "pipeline/preview.h"
#include "pipeline/prompt_check.h"
#include "pipeline/safety.h"
#include "weights/safety_model.h"
#include "pipeline/tiny_decoder.h"

namespace klein::cli {
namespace {

struct Args {
  ModelPaths model;
  GenerateOptions gen;
  std::string output;
  uint64_t seed = 0;
  float guidance = 0;
  std::vector<std::string> references;
  std::string noise, vae_noise, dump, preview;
  std::string cache_dir;
  int threads = 0;
  int jpeg_quality = 95;
  MemoryOptions memory;
  bool no_cache = false, quiet = false, json = false, verbose = false, dry_run = false;
  bool upsample = false;
  bool check_prompt = false;  // --check-prompt: BFL's prompt check before any image work
  bool no_watermark = false;
  bool prompt_given = false;  // -p was given: "" is a prompt (the empty one), not a missing one
  int batch = 1;             // --batch: images of one prompt, seeds s, s+1, ...
  std::string prompts_file;  // --prompts: one image per line, image i with seed s+i

  UpsampleArgs upsample_args;

  // --safety: the safety classifier on the inputs and the generated image.
  bool safety = false;
  std::string safety_model;  // --safety-model DIR (else $KLEIN_SAFETY_MODEL)
  std::optional<double> safety_threshold;
  std::optional<std::string> safety_action;

  // The tiny autoencoder: previews by it, and --decoder tiny.
  std::string tiny_vae;
  std::string decoder = "full";
};

// Progress on stderr: on a terminal, one line per phase rewritten in place while it runs;
// into a file or a pipe, one plain line per event (no carriage returns in logs).
class TerminalProgress final : public Progress {
 public:
  TerminalProgress(bool quiet, bool verbose)
      : quiet_(quiet), verbose_(verbose), terminal_(::isatty(::fileno(stderr)) == 1) {}
  void memory_plan(const MemoryPlan& plan) override {
    // Running without read-ahead is slower: say so even when not verbose.
    if (!verbose_ && (quiet_ || plan.read_ahead)) return;
    std::fprintf(stderr, "memory: %s\n", plan.reason.c_str());
    if (!verbose_) return;
    std::fprintf(stderr, "  budget %s (%s), available %s; need resident %s, paged %s, paged "
                 "without read-ahead %s (program %s)\n", format_bytes(plan.budget).c_str(),
                 plan.budget_given ? "--max-memory" : "from the available memory",
                 format_bytes(plan.available).c_str(), format_bytes(plan.need.resident()).c_str(),
                 format_bytes(plan.need.paged()).c_str(), format_bytes(plan.need.one_unit()).c_str(),
                 format_bytes(plan.need.fixed).c_str());
    for (const auto& p : plan.need.phases) {
      std::fprintf(stderr, "  %-14s weights %s paged / %s resident / %s one unit, activations %s",
                   p.phase.c_str(), format_bytes(p.weights_paged).c_str(),
                   format_bytes(p.weights_resident).c_str(),
                   format_bytes(p.weights_one_unit).c_str(), format_bytes(p.activations).c_str());
      if (p.scratch > 0)
        std::fprintf(stderr, "; scratch files %s on disk in %s", format_bytes(p.scratch).c_str(),
                     p.scratch_dir.c_str());
      std::fprintf(stderr, "\n");
    }
  }
  void begin(const std::string& phase, int total) override {
    start_ = last_line_ = std::chrono::steady_clock::now();
    if (!quiet_ && terminal_) std::fprintf(stderr, "%s...", phase.c_str());
  }
  void step(const std::string& phase, int done, int total) override {
    if (quiet_) return;
    // Into a log, the layers and blocks of the other phases make a line a second at most.
    if (!terminal_ && phase != "denoise" && done < total && seconds_since(last_line_) < 1.0) return;
    last_line_ = std::chrono::steady_clock::now();
    const double elapsed = seconds_since(start_);
    const double per = elapsed / done;
    std::fprintf(stderr, "%s%s: step %d/%d  %.2f s/step  ETA %.0f s%s", terminal_ ? "\r" : "",
                 phase.c_str(), done, total, per, per * (total - done), terminal_ ? "   " : "\n");
  }
  void end(const std::string& phase, double seconds) override {
    if (quiet_) return;
    if (terminal_)
      std::fprintf(stderr, "\r%s: %.2f s%30s\n", phase.c_str(), seconds, "");
    else
      std::fprintf(stderr, "%s: %.2f s\n", phase.c_str(), seconds);
  }
  void warn(const std::string& message) override {
    std::fprintf(stderr, "%swarning: %s\n", terminal_ ? "\n" : "", message.c_str());
  }

 private:
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }
  bool quiet_, verbose_, terminal_;
  std::chrono::steady_clock::time_point start_, last_line_;
};

// Progress as JSON lines on stdout, one event per line.
class JsonProgress final : public Progress {
 public:
  void begin(const std::string& phase, int total) override {
    emit({{"event", "begin"}, {"phase", phase}, {"total", total}});
  }
  void step(const std::string& phase, int done, int total) override {
    emit({{"event", "step"}, {"phase", phase}, {"done", done}, {"total", total}});
  }
  void end(const std::string& phase, double seconds) override {
    emit({{"event", "end"}, {"phase", phase}, {"seconds", seconds}});
  }
  void warn(const std::string& message) override { emit({{"event", "warning"}, {"message", message}}); }
  void memory_plan(const MemoryPlan& plan) override {
    nlohmann::ordered_json j;
    j["event"] = "memory";
    j.update(plan.to_json());
    emit(j);
  }
  static void emit(const nlohmann::ordered_json& j) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
};

std::string lowercase(std::string text) {
  for (auto& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// What the run measured, for --verbose and --json.
struct LoadPhase {
  double seconds = 0;
  uint64_t peak_rss = 0;
};

// The whole run's peak: the kernel's counters are updated lazily, so a phase's reading can
// exceed the process mark by a few pages.
uint64_t overall_peak_rss(const GenerateResult& r, const LoadPhase& load) {
  uint64_t peak = std::max(peak_rss_bytes(), load.peak_rss);
  for (const auto& m : r.phase_memory) peak = std::max(peak, m.peak_rss_bytes);
  return peak;
}

nlohmann::ordered_json result_json(const Args& a, const GenerateResult& r, const LoadPhase& load,
                                   double total, int threads) {
  nlohmann::ordered_json j;
  j["event"] = "result";
  j["output"] = a.output;
  j["seed"] = r.seed ? nlohmann::json(*r.seed) : nlohmann::json(nullptr);  // none: --noise
  if (!a.gen.original_prompt.empty()) {
    j["prompt"] = a.gen.prompt;
    j["original_prompt"] = a.gen.original_prompt;
  }
  j["width"] = r.width;
  j["height"] = r.height;
  j["steps"] = r.steps;
  j["guidance"] = r.guidance;
  j["context_from_cache"] = r.context_from_cache;
  j["precision"] = precision_name(r.fast);
  j["timings"]["load"] = load.seconds;
  for (const auto& [phase, s] : r.timings) j["timings"][phase] = s;
  j["denoise_setup_seconds"] = r.denoise_setup_seconds;
  j["step_seconds"] = r.step_seconds;
  if (r.step_cache) j["step_cache"] = step_cache_json(*r.step_cache);
  j["total_seconds"] = total;
  j["phase_peak_rss_bytes"]["load"] = load.peak_rss;
  for (const auto& m : r.phase_memory) j["phase_peak_rss_bytes"][m.phase] = m.peak_rss_bytes;
  for (const auto& m : r.phase_memory) j["phase_start_rss_bytes"][m.phase] = m.start_rss_bytes;
  j["peak_rss_bytes"] = overall_peak_rss(r, load);
  if (r.memory) {
    j["residency"] = residency_name(r.memory->residency);
    j["memory"] = r.memory->to_json();
  }
  j["weights_peak_units"] = r.weights.peak_units;
  j["weights_peak_bytes"] = r.weights.peak_bytes;
  j["threads"] = threads;
  if (r.safety) j["safety"] = safety_json(*r.safety);
  j["warnings"] = r.warnings;
  return j;
}

void print_verbose(const GenerateResult& r, const LoadPhase& load) {
  std::fprintf(stderr, "%-14s %9s %12s %12s\n", "phase", "seconds", "RSS at start", "peak RSS");
  std::fprintf(stderr, "%-14s %9.2f %12s %12s\n", "load", load.seconds, "",
               format_bytes(load.peak_rss).c_str());
  for (size_t i = 0; i < r.timings.size(); ++i) {
    const auto& [phase, seconds] = r.timings[i];
    std::string start, peak;
    if (i < r.phase_memory.size()) {
      start = format_bytes(r.phase_memory[i].start_rss_bytes);
      peak = format_bytes(r.phase_memory[i].peak_rss_bytes);
    }
    std::fprintf(stderr, "%-14s %9.2f %12s %12s\n", phase.c_str(), seconds, start.c_str(),
                 peak.c_str());
    if (phase == "denoise") {
      std::fprintf(stderr, "  %-12s %9.2f\n", "setup", r.denoise_setup_seconds);
      for (size_t s = 0; s < r.step_seconds.size(); ++s)
        std::fprintf(stderr, "  step %-7zu %9.2f\n", s + 1, r.step_seconds[s]);
    }
  }
  std::fprintf(stderr, "weights: at most %zu unit%s (%s) resident at once\n",
               r.weights.peak_units, r.weights.peak_units == 1 ? "" : "s",
               format_bytes(r.weights.peak_bytes).c_str());
}

// The most images one `klein generate` makes (--batch, or the lines of --prompts).
constexpr int kMaxBatch = 1000;

// Where image i of n goes: the -o name itself for one image, else "-i" before the
// extension (out.png → out-0.png, out-1.png, ...).
std::string batch_output(const std::string& output, int i, int n) {
  if (n == 1) return output;
  const std::filesystem::path p(output);
  return (p.parent_path() / (p.stem().string() + "-" + std::to_string(i) + p.extension().string()))
      .string();
}

// The prompts of --prompts FILE: one per line, blank lines skipped, trailing \r dropped.
std::vector<std::string> read_prompts(const std::string& path) {
  constexpr uint64_t kMaxBytes = uint64_t(16) << 20;  // 1000 prompts of 16 KiB
  const uint64_t bytes = FileStamp::of(path).size;
  check(bytes <= kMaxBytes, "--prompts ", path, ": ", bytes, " bytes; a prompts file holds at most ",
        kMaxBytes, " (one prompt per line, at most ", kMaxBatch, " lines)");
  const std::string text = read_text_file(path);
  std::vector<std::string> prompts;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) prompts.push_back(line);
    begin = end + 1;
  }
  check(!prompts.empty(), "--prompts ", path, ": no prompt in the file (one per line, blank "
        "lines skipped)");
  check(prompts.size() <= size_t(kMaxBatch), "--prompts ", path, ": ", prompts.size(),
        " prompts; at most ", kMaxBatch, " images per run");
  return prompts;
}

void run_one(Args& a);
void run_batch(Args& a, const std::vector<std::string>& prompts, uint64_t seed);

// --batch N and --prompts FILE: the images in order, image i with seed s+i, each the image
// `klein generate` makes alone with that prompt and seed (run_batch: the model opened once,
// each distinct prompt encoded once, the images denoised together).
void run(Args& a) {
  check(a.prompt_given || !a.prompts_file.empty(),
        "-p/--prompt or --prompts FILE is required (-p \"\" for the empty prompt)");
  check(!a.prompt_given || a.prompts_file.empty(),
        "-p/--prompt and --prompts: give one (--prompts has one prompt per line)");
  check(a.batch == 1 || a.prompts_file.empty(),
        "--batch and --prompts: give one (--prompts makes one image per line)");
  std::vector<std::string> prompts;
  if (!a.prompts_file.empty())
    prompts = read_prompts(a.prompts_file);
  else
    prompts.assign(size_t(a.batch), a.gen.prompt);
  const int n = int(prompts.size());
  if (n == 1) {
    a.gen.prompt = prompts[0];
    run_one(a);
    return;
  }
  const char* what = a.prompts_file.empty() ? "--batch" : "--prompts";
  check(a.noise.empty(), what, " with --noise: the images would all start from the same noise; "
        "give seeds instead (--seed s: image i gets s+i)");
  check(a.vae_noise.empty(), what, " with --vae-noise: the images would all share it; "
        "give seeds instead");
  check(a.dump.empty(), what, " with --dump: one image's stages at a time");
  check(a.preview.empty(), what, " with --preview: one image's preview at a time");
  check(!a.upsample, what, " with --upsample is not supported");
  if (a.dry_run) {  // the plan of the batch: every image's activations at once
    a.gen.prompt = prompts[0];
    a.gen.batch = n;
    run_one(a);
    return;
  }
  check(!a.output.empty(), "-o/--output is required (the images to write: ", batch_output(
        "out.png", 0, n), ", ", batch_output("out.png", 1, n), ", ... for -o out.png)");
  check(is_image_name(a.output), "-o ", a.output,
        ": the output must end in .png, .jpg, .jpeg or .webp");
  for (int i = 0; i < n; ++i) check_writable_output(batch_output(a.output, i, n), "-o");
  const uint64_t seed = a.gen.seed ? *a.gen.seed : random_seed();
  run_batch(a, prompts, seed);
}

// --safety and its options: the classifier opened (every file checked) before the model is.
void fill_safety(Args& a) {
  SafetyOptions& s = a.gen.safety;
  const bool on = a.safety || !a.safety_model.empty();
  check(on || (!a.safety_threshold && !a.safety_action),
        "--safety-threshold and --safety-action need --safety (or --safety-model DIR)");
  if (a.safety_threshold) {
    vit::check_threshold(*a.safety_threshold, "--safety-threshold");
    s.threshold = *a.safety_threshold;
  }
  if (a.safety_action) s.action = parse_safety_action(*a.safety_action, "--safety-action");
  if (!on || s.model) return;
  std::string dir = a.safety_model;
  std::string given_by = "--safety-model";
  if (dir.empty())
    if (const char* env = std::getenv("KLEIN_SAFETY_MODEL")) dir = env, given_by = "KLEIN_SAFETY_MODEL";
  // Else the classifier the model's container holds (klein convert --safety-model).
  if (dir.empty() && container_has_safety_model(a.model.model))
    dir = a.model.model.string(), given_by = "-m";
  check(!dir.empty(), "--safety: no classifier given: --safety-model DIR (the Hugging Face "
        "directory of Falconsai/nsfw_image_detection), KLEIN_SAFETY_MODEL, or a container "
        "converted with --safety-model");
  s.model = open_shared_safety_model(dir, given_by);
}

// --control-preprocess: "canny" or "canny:LOW:HIGH".
std::pair<double, double> parse_canny(const std::string& v) {
  std::pair<double, double> t = {100, 200};
  if (v == "canny") return t;
  char low[32] = {}, high[32] = {};
  const bool ok = v.size() < 64 && v.rfind("canny:", 0) == 0 &&
                  std::sscanf(v.c_str(), "canny:%31[^:]:%31s", low, high) == 2;
  char* end = nullptr;
  if (ok) t.first = std::strtod(low, &end);
  const bool low_ok = ok && end && *end == 0;
  if (low_ok) t.second = std::strtod(high, &end);
  check(low_ok && end && *end == 0 && std::isfinite(t.first) && std::isfinite(t.second) &&
            t.first >= 0 && t.second >= 0,
        "--control-preprocess: expected canny or canny:LOW:HIGH (thresholds of 0 or more), got \"",
        v, "\"");
  return t;
}

// The generation's options from the command line; returns why the prompt cache is off when
// it was not turned off (empty otherwise).
std::string fill_options(Args& a) {
  GenerateOptions& g = a.gen;
  g.max_memory = a.memory.budget();  // a bad size fails before anything is loaded
  g.residency = a.memory.forced();
  for (const auto& r : a.references) g.references.push_back(r);
  g.watermark = !a.no_watermark;
  g.noise_file = a.noise;
  g.vae_noise_file = a.vae_noise;
  g.dump_dir = a.dump;
  std::string cache_off;  // why the prompt cache is off although it was not turned off
  if (!a.no_cache) {
    if (!a.cache_dir.empty()) {
      g.prompt_cache_dir = a.cache_dir;
    } else {
      try {
        g.prompt_cache_dir = qwen3::PromptCache::default_dir();
      } catch (const Error& e) {
        cache_off = e.what();
      }
    }
  }
  g.plan_only = a.dry_run;
  fill_safety(a);
  check(a.decoder == "full" || a.decoder == "tiny", "--decoder ", a.decoder,
        ": expected full (the model's VAE) or tiny (the tiny autoencoder of --tiny-vae or of the "
        "container)");
  g.tiny.decode = a.decoder == "tiny";
  // Without --tiny-vae, the container's (the pipeline refuses --decoder tiny with neither).
  if (!a.tiny_vae.empty()) g.tiny.model = open_shared_tiny_decoder(a.tiny_vae, "--tiny-vae");
  return cache_off;
}

// Writes the image with its metadata and prints the result line (or the JSON result).
void write_result(const Args& a, const GenerateOptions& g, const GenerateResult& r,
                  const Model& model, const LoadPhase& load,
                  std::chrono::steady_clock::time_point start, const Compute& cx) {
  const std::string metadata_json = parameters_json(g, r, model.name, model.checksum);
  ImageMetadata meta = {{"parameters", parameters_text(g, r, model.name)},
                        {"klein", metadata_json},
                        {kXmpKey, provenance_xmp(metadata_json)}};
  save_image(a.output, r.image, meta, a.jpeg_quality);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (a.json) {
    JsonProgress::emit(result_json(a, r, load, total, cx.threads()));
  } else {
    if (a.verbose) print_verbose(r, load);
    const std::string seed = r.seed ? "seed " + std::to_string(*r.seed) : "noise from a file";
    std::fprintf(stderr, "%s, %lldx%lld, %lld steps, %.1f s, peak RSS %.0f MiB, %s%s%s\n",
                 seed.c_str(), static_cast<long long>(r.width),
                 static_cast<long long>(r.height), static_cast<long long>(r.steps), total,
                 double(overall_peak_rss(r, load)) / (1 << 20), precision_name(r.fast),
                 r.memory ? ", " : "", r.memory ? residency_name(r.memory->residency) : "");
    std::printf("%s\n", a.output.c_str());
  }
}

// The model, opened for the run (its time and peak memory in `load`).
Model open_model(const Args& a, LoadPhase& load) {
  const auto start = std::chrono::steady_clock::now();
  const bool exact = reset_peak_rss();
  Model model = Model::open(a.model);
  load.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  load.peak_rss = exact ? peak_rss_since_reset() : peak_rss_bytes();
  return model;
}

// --check-prompt: each distinct prompt asked about as BFL's reference asks
// (pipeline/prompt_check.h); a flagged one stops the run (PromptFlagged: exit status 2)
// before any image work.
void check_prompts(const Args& a, Model& model, Compute& cx, Progress& progress,
                   const std::vector<std::string>& prompts) {
  const std::string why = prompt_check_unavailable(model);
  check(why.empty(), "--check-prompt: ", why);
  PromptChecker checker(model, cx, a.gen.prompt_cache_dir);
  std::vector<std::string> done;
  for (const std::string& prompt : prompts) {
    if (std::find(done.begin(), done.end(), prompt) != done.end()) continue;
    done.push_back(prompt);
    progress.begin("check prompt", 0);
    const PromptCheck c = checker.check(prompt);
    progress.end("check prompt", c.seconds);
    if (!c.store_error.empty()) progress.warn("prompt cache: " + c.store_error);
    const std::string refusal = c.flagged ? prompt_check_refusal("--check-prompt") : "";
    if (a.json) {
      nlohmann::ordered_json e = {{"event", "prompt_check"}, {"prompt", prompt},
                                  {"flagged", c.flagged},   {"yes_logit", c.yes_logit},
                                  {"no_logit", c.no_logit}, {"chat_tokens", c.chat_tokens},
                                  {"reused_tokens", c.reused_tokens},
                                  {"reused_from_cache", c.prefix_from_cache},
                                  {"seconds", c.seconds}};
      if (c.flagged) e["message"] = refusal;
      JsonProgress::emit(e);
    }
    if (c.flagged) throw PromptFlagged(refusal, c);
  }
}

void run_one(Args& a) {
  GenerateOptions& g = a.gen;
  const std::string cache_off = fill_options(a);
  check(a.dry_run || !a.output.empty(), "-o/--output is required (the image to write)");
  check(a.dry_run || is_image_name(a.output), "-o ", a.output,
        ": the output must end in .png, .jpg, .jpeg or .webp");
  if (!a.dry_run) check_writable_output(a.output, "-o");  // before any long work
  if (!a.preview.empty()) {
    check(is_image_name(a.preview), "--preview ", a.preview,
          ": the preview must end in .png, .jpg, .jpeg or .webp");
    check_writable_output(a.preview, "--preview");
  }

  a.upsample_args.edit = !a.references.empty();
  const std::optional<UpsampleOptions> upsample =
      a.upsample ? std::optional(a.upsample_args.options("upsample-")) : std::nullopt;
  check(a.upsample || a.upsample_args.endpoint.empty(),
        "--upsample-endpoint needs --upsample (the prompt is rewritten only when asked)");
  const std::optional<hub::ChatEndpoint> remote =
      upsample ? a.upsample_args.remote(*upsample) : std::nullopt;

  const auto start = std::chrono::steady_clock::now();
  Compute cx(a.threads);
  LoadPhase load;
  Model model = open_model(a, load);
  Session session(model, cx);
  TerminalProgress terminal(a.quiet || a.json, (a.verbose || a.dry_run) && !a.json);
  JsonProgress json_events;
  Progress& progress = a.json ? static_cast<Progress&>(json_events) : terminal;

  if (!cache_off.empty()) progress.warn("prompt cache off: " + cache_off);
  if (!a.dry_run && lowercase(a.output).ends_with(".webp"))
    progress.warn("-o " + a.output + ": WebP carries no text metadata, so the image will not record "
                  "its prompt and settings (PNG and JPEG do)");
  if (a.check_prompt && !a.dry_run) check_prompts(a, model, cx, progress, {g.prompt});
  if (remote) {
    progress.begin("upsample prompt", 0);
    std::vector<std::filesystem::path> images;
    for (const auto& r : a.references) images.emplace_back(r);
    const hub::RemoteUpsample u = upsample_remotely(*remote, a.upsample_args, *upsample, g.prompt,
                                                    images);
    progress.end("upsample prompt", u.seconds);
    if (u.fell_back) {
      progress.warn(u.warning);
    } else {
      g.original_prompt = g.prompt;
      g.prompt = u.prompt;
    }
    if (a.json)
      JsonProgress::emit({{"event", "upsampled"}, {"prompt", g.prompt},
                          {"original_prompt", g.original_prompt.empty() ? g.prompt : g.original_prompt},
                          {"remote", true}, {"fell_back", u.fell_back}, {"seconds", u.seconds}});
    else if (!a.quiet && !u.fell_back)
      std::fprintf(stderr, "prompt (remote): %s\n", u.prompt.c_str());
  } else if (upsample) {
    const std::string why = upsample_unavailable(model);
    check(why.empty(), why);
    progress.begin("upsample prompt", upsample->max_new_tokens);
    const auto t0 = std::chrono::steady_clock::now();
    const UpsampleResult u = upsample_prompt(model, cx, g.prompt, *upsample, [&](int n) {
      progress.step("upsample prompt", n, upsample->max_new_tokens);
    });
    progress.end("upsample prompt",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    g.original_prompt = g.prompt;
    g.prompt = u.prompt;
    const std::string seed =
        u.sampled ? "upsample seed " + std::to_string(upsample->seed) : "greedy";
    if (a.json) {
      nlohmann::ordered_json e = {{"event", "upsampled"}, {"prompt", u.prompt},
                                  {"original_prompt", g.original_prompt},
                                  {"new_tokens", u.new_tokens},
                                  {"prefill_seconds", u.prefill_seconds},
                                  {"decode_seconds", u.decode_seconds}};
      if (u.sampled) e["upsample_seed"] = upsample->seed;
      JsonProgress::emit(e);
    } else if (!a.quiet) {
      std::fprintf(stderr, "prompt (%s): %s\n", seed.c_str(), u.prompt.c_str());
    }
  }
  StepHook preview;
  if (!a.preview.empty())
    preview = [&a](const StepView& s) {
      save_image(a.preview, s.preview());
    };
  GenerateResult r = session.generate(g, progress, preview);
  if (a.dry_run) return;  // the plan is printed (or emitted as JSON); nothing to write
  write_result(a, g, r, model, load, start, cx);
}

// --batch / --prompts: every image started (all options checked, the memory plan counting
// the batch's activations), every prompt encoded (once per distinct prompt), every latent
// prepared, then one denoising loop for all of them (Session::denoise of a batch: each
// transformer block once per step for every image), then each decoded and written. When the
// budget does not hold all of them together, the same in groups that it holds.
void run_batch(Args& a, const std::vector<std::string>& prompts, uint64_t seed) {
  const int n = int(prompts.size());
  const std::string cache_off = fill_options(a);
  const auto start = std::chrono::steady_clock::now();
  Compute cx(a.threads);
  LoadPhase load;
  Model model = open_model(a, load);
  Session session(model, cx);
  TerminalProgress terminal(a.quiet || a.json, a.verbose && !a.json);
  JsonProgress json_events;
  Progress& progress = a.json ? static_cast<Progress&>(json_events) : terminal;
  if (!cache_off.empty()) progress.warn("prompt cache off: " + cache_off);
  if (lowercase(a.output).ends_with(".webp"))
    progress.warn("-o " + a.output + ": WebP carries no text metadata, so the images will not "
                  "record their prompts and settings (PNG and JPEG do)");
  if (a.check_prompt) check_prompts(a, model, cx, progress, prompts);
  std::vector<Args> each(size_t(n), a);
  std::vector<GenerateOptions> images;
  for (int i = 0; i < n; ++i) {
    Args& one = each[size_t(i)];
    one.gen.prompt = prompts[size_t(i)];
    one.gen.seed = seed + uint64_t(i);
    one.output = batch_output(a.output, i, n);
    images.push_back(one.gen);
  }
  session.generate_batch(images, progress, [&](size_t i, GenerateResult& r) {
    write_result(each[i], images[i], r, model, load, start, cx);
  });
}

Registration generate_command("generate", 10, [](CLI::App& app) {
  auto a = std::make_shared<Args>();
  auto* cmd = app.add_subcommand("generate", "Generate an image from a prompt (and reference images)");
  add_model_options(*cmd, a->model);
  CLI::Option* prompt = cmd->add_option(
      "-p,--prompt", a->gen.prompt,
      "What to draw (\"\": the empty prompt, unconditional generation as the official "
      "pipelines make it)");
  cmd->add_option("-o,--output", a->output, "Output image (.png, .jpg/.jpeg, or .webp: lossless, no metadata); "
                  "with several images (--batch, --prompts) image i is written with -i before the "
                  "extension: -o out.png writes out-0.png, out-1.png, ...");
  cmd->add_option("--batch", a->batch,
                  "Make N images of the prompt, with seeds s, s+1, ..., s+N-1 (s: --seed, else "
                  "random); each is the image the same prompt and seed make alone")
      ->check(CLI::Range(1, kMaxBatch))->type_name("N");
  cmd->add_option("--prompts", a->prompts_file,
                  "Instead of -p: one image per line of FILE (blank lines skipped); image i gets "
                  "seed s+i")
      ->check(CLI::ExistingFile)->type_name("FILE");
  cmd->add_option("-W,--width", a->gen.width, "Width in pixels (default: the init image's or the first reference's, else 1024)")
      ->check(CLI::Range(int64_t(16), int64_t(8192)));
  cmd->add_option("-H,--height", a->gen.height, "Height in pixels (default: the init image's or the first reference's, else 1024)")
      ->check(CLI::Range(int64_t(16), int64_t(8192)));
  cmd->add_option("-s,--steps", a->gen.steps,
                  "Denoising steps (default: the model's pipeline's; --variant lists them)")
      ->check(CLI::Range(int64_t(1), kMaxSteps));
  cmd->add_option_function<std::string>(
      "--seed", [a](const std::string& s) { a->gen.seed = parse_seed(s, "--seed"); },
      "Seed of the initial noise, 0 to 2^64-1 (default: random, always printed)");
  cmd->add_option("-r,--reference", a->references, "Reference image(s) for editing, in order")
      ->check(CLI::ExistingFile);
  cmd->add_option("--preview", a->preview,
                  "After every step, write a preview of the image forming (.png or .jpg), "
                  "replaced atomically: with --tiny-vae the tiny decoder's picture of the step's "
                  "estimate (at most --preview-size on the long side), else a colour fit of the "
                  "latents (one pixel per 8x8)");
  cmd->add_option("--preview-size", a->gen.tiny.preview_size,
                  "Longest side of a tiny decoder's preview, in pixels")
      ->default_val(256)
      ->check(CLI::Range(8, 8192));
  cmd->add_option("--tiny-vae", a->tiny_vae,
                  "A tiny autoencoder's decoder (madebyollin/taesd: taef2_decoder.pth for FLUX.2, "
                  "taef1_decoder.pth for Z-Image, or a .safetensors copy; or a directory holding "
                  "one): previews by it, and --decoder tiny. Default: the container's (klein "
                  "convert --tiny-vae)")
      ->type_name("FILE|DIR");
  cmd->add_option("--decoder", a->decoder,
                  "What decodes the final latents: full (the model's VAE) or tiny (the tiny "
                  "autoencoder of --tiny-vae or the container: a draft at a fraction of the cost)")
      ->default_val("full");
  cmd->add_option("-i,--init-image", a->gen.init_image,
                  "Image-to-image: start from this picture (the output takes its size, floored "
                  "to multiples of 16, unless -W/-H are given; Z-Image keeps its size)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--mask", a->gen.mask,
                  "Inpainting, with --init-image: white repaints, black keeps (the output keeps "
                  "the init image's size; -r references still apply)")
      ->check(CLI::ExistingFile);
  cmd->add_option_function<double>(
         "--strength",
         [a](double s) {
           check(std::isfinite(s) && s > 0 && s <= 1, "--strength: expected a number in (0, 1], "
                 "got ", s);
           a->gen.strength = s;
         },
         "With --init-image: how much to change it, (0, 1]; the last int(steps x strength) "
         "steps run (default 0.8; Z-Image 0.6, and 1 with --mask)");
  cmd->add_option_function<std::vector<std::string>>(
         "--lora",
         [a](const std::vector<std::string>& list) {
           for (const auto& text : list) a->gen.loras.push_back(parse_lora_argument(text));
         },
         "LoRA of the transformer, FILE or FILE:SCALE (default scale 1); repeat for several. "
         "diffusers/PEFT, BFL/ai-toolkit and kohya safetensors; applied beside the weights")
      ->type_name("FILE[:SCALE]");
  cmd->add_option_function<float>(
         "-g,--guidance",
         [a](float g) {
           check(std::isfinite(g) && g >= 0 && g <= 100, "-g/--guidance: expected a number from 0 "
                 "to 100, got ", g);
           a->gen.guidance = g;
         },
         "Guidance scale: klein-base (default 4; distilled klein has none), Z-Image (default 0 "
         "for Turbo; > 0 turns classifier-free guidance on)");
  cmd->add_option("-n,--negative", a->gen.negative_prompt,
                  "Negative prompt (with classifier-free guidance: klein-base, Z-Image)");
  cmd->add_option_function<float>(
         "--cfg-normalization",
         [a](float c) {
           check(std::isfinite(c) && c >= 0, "--cfg-normalization: expected a number of 0 (off) "
                 "or more, got ", c);
           a->gen.cfg_normalization = c;
         },
         "Z-Image with guidance: scale the guided prediction back to C x the positive one's "
         "norm when it is longer (ZImagePipeline's cfg_normalization; True is 1; default 0, off)")
      ->type_name("C");
  cmd->add_option_function<float>(
         "--cfg-truncation",
         [a](float t) {
           check(std::isfinite(t), "--cfg-truncation: expected a number, got ", t);
           a->gen.cfg_truncation = t;
         },
         "Z-Image with guidance: steps whose model time (0 at noise, rising to 1) is above T run "
         "unguided (ZImagePipeline's cfg_truncation; default 1, guidance at every step)")
      ->type_name("T");
  cmd->add_option_function<std::string>(
         "--cache",
         [a](const std::string& spec) { a->gen.step_cache = parse_step_cache(spec); },
         "Step caching for many-step runs: first-block:T skips a step's transformer layers after "
         "the first when the first one's residual changed by at most T (relative) since the last "
         "full step, reusing the others' kept residual (diffusers' FirstBlockCache; Z-Image; "
         "off by default; T = 0 skips nothing)")
      ->type_name("first-block:T");
  cmd->add_option("--threads", a->threads, "Worker threads (default: the usable CPUs)")
      ->check(CLI::Range(0, kMaxThreads));
  cmd->add_option("--noise", a->noise,
                  "Initial noise as float32 .npy: [1, 128, H/16, W/16] for klein, [1, 16, H/8, W/8] "
                  "for Z-Image")
      ->check(CLI::ExistingFile);
  cmd->add_option("--controlnet", a->gen.controlnet,
                  "Z-Image: a control model (Z-Image-Turbo-Fun-Controlnet-Union 2.1: a diffusers "
                  "directory or the original .safetensors file), with --control-image; default: "
                  "the one the container holds (klein convert --controlnet)")
      ->check(CLI::ExistingPath);
  cmd->add_option("--control-image", a->gen.control_image,
                  "Z-Image with a control model: the image the generation follows (edges, depth, "
                  "pose...; scaled to the output size, which is its own unless -W/-H are given); "
                  "with --init-image and --mask: inpainting guided by it")
      ->check(CLI::ExistingFile);
  cmd->add_option_function<float>(
         "--control-scale",
         [a](float v) {
           check(std::isfinite(v), "--control-scale: expected a number, got ", v);
           a->gen.control_scale = v;
         },
         "How strongly the control image steers (controlnet_conditioning_scale; default 0.75)")
      ->type_name("S");
  cmd->add_option_function<std::string>(
         "--control-preprocess",
         [a](const std::string& v) { a->gen.control_canny = parse_canny(v); },
         "canny[:LOW:HIGH]: the control image is a picture; its Canny edges (OpenCV's, default "
         "thresholds 100 and 200, as `klein control canny`) are the control image")
      ->type_name("canny");
  cmd->add_option("--vae-noise", a->vae_noise,
                  "Z-Image with --init-image and --noise: the noise of the init image's VAE "
                  "sample (mean + std x noise) as float32 .npy [1, 16, H/8, W/8]; without "
                  "--noise the seed draws it")
      ->check(CLI::ExistingFile);
  cmd->add_option("--dump", a->dump, "Write every stage as .npy files into this directory");
  cmd->add_option("--jpeg-quality", a->jpeg_quality, "JPEG quality 1-100")->check(CLI::Range(1, 100));
  cmd->add_flag("--no-cache", a->no_cache, "Do not read or write the prompt cache");
  cmd->add_option("--cache-dir", a->cache_dir,
                  "Prompt cache directory (default: $XDG_CACHE_HOME/klein/prompts or "
                  "~/.cache/klein/prompts; without either the cache is off)");
  add_precision_option(*cmd, a->gen.precision);
  add_memory_options(*cmd, a->memory);
  cmd->add_flag("-q,--quiet", a->quiet, "No progress output");
  cmd->add_flag("-v,--verbose", a->verbose,
                "The memory decision, and time and peak RSS per phase and per step");
  cmd->add_flag("--dry-run", a->dry_run,
                "Print the memory estimate and decision for these options and exit (no -o)");
  cmd->add_flag("--json", a->json, "Progress events and the result as JSON lines on stdout");
  cmd->add_flag("--no-watermark", a->no_watermark,
                "Leave the pixels without the invisible dwtDct mark (FLUX's message) that images "
                "of at least 256x256 pixels carry by default");
  cmd->add_flag("--upsample", a->upsample,
                "Rewrite the prompt into a detailed one with the model's text encoder as a "
                "chat model before encoding it (greedy unless an --upsample-temperature, -top-p, "
                "-top-k or -seed is given); the image records both prompts");
  add_upsample_options(*cmd, a->upsample_args, "upsample-");
  cmd->add_flag("--check-prompt", a->check_prompt,
                "Before any image work, ask the text encoder (run as a language model: a "
                "container made with --keep-llm, or the diffusers directory) whether the prompt "
                "names copyrighted characters, brands or living public figures, as BFL's "
                "reference does; a flagged prompt stops the run with exit status 2 and no image");
  cmd->add_flag("--safety", a->safety,
                "Classify the input images before any work and the generated image after "
                "decoding with FLUX.2's safety classifier (BFL's check); a flagged image "
                "(nsfw probability above --safety-threshold) stops the run with exit status 2 "
                "and no image, unless --safety-action blur");
  cmd->add_option("--safety-model", a->safety_model,
                  "The classifier's Hugging Face directory (config.json, model.safetensors, "
                  "preprocessor_config.json of Falconsai/nsfw_image_detection); implies "
                  "--safety; default $KLEIN_SAFETY_MODEL")
      ->type_name("DIR");
  cmd->add_option_function<double>(
         "--safety-threshold", [a](double t) { a->safety_threshold = t; },
         "Flag an image when its nsfw probability is strictly above this, in [0, 1] "
         "(default 0.85, BFL's)")
      ->type_name("P");
  cmd->add_option_function<std::string>(
         "--safety-action", [a](const std::string& s) { a->safety_action = s; },
         "What a flagged generated image gets: refuse (no image, exit status 2; the default) "
         "or blur (a strongly blurred image, its metadata saying why); a flagged input image "
         "always stops the run")
      ->type_name("refuse|blur");
  cmd->callback([a, prompt] {
    a->prompt_given = prompt->count() > 0;
    try {
      run(*a);
    } catch (const PromptFlagged& e) {  // its JSON event is out already (check_prompts)
      std::fprintf(stderr, "error: %s\n", e.what());
      throw CLI::RuntimeError(kExitFlagged);
    } catch (const SafetyFlagged& e) {
      // Not an error of the input or the engine: a status of its own, and the verdict as a
      // JSON event for --json.
      if (a->json)
        JsonProgress::emit({{"event", "safety"},
                            {"image", e.check.image},
                            {"nsfw", e.check.nsfw},
                            {"flagged", true},
                            {"threshold", e.threshold},
                            {"message", e.what()}});
      std::fprintf(stderr, "error: %s\n", e.what());
      throw CLI::RuntimeError(kExitFlagged);
    }
  });
});

}  // namespace
}  // namespace klein::cli
