// klein convert: a published checkpoint (or another container) -> one klein container.
// Parses the options, installs the interrupt handler and prints progress; the conversion
// itself is convert/convert.h.
#include "convert/convert.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/convert_run.h"
#include "cli/model_options.h"
#include "convert/policy.h"
#include "core/error.h"
#include "core/files.h"
#include "pipeline/tiny_decoder.h"
#include "weights/family.h"

namespace klein::cli {
namespace {

// Ctrl-C, SIGTERM or SIGHUP (a closed terminal): the first asks the converter to stop (it
// removes its temporary file and returns an error); a second one removes the temporary file
// here and exits at once.
std::atomic<bool> g_cancel{false};
char g_temp_path[4096];

extern "C" void on_interrupt(int sig) {
  if (!g_cancel.exchange(true)) return;
  if (g_temp_path[0]) ::unlink(g_temp_path);
  ::_exit(128 + sig);
}

class InterruptGuard {
 public:
  InterruptGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_interrupt;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGHUP, &sa, &old_hup_);
  }
  ~InterruptGuard() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGHUP, &old_hup_, nullptr);
    g_temp_path[0] = '\0';
  }

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_hup_ {};
};

std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", double(bytes) / 1e6);
  return buf;
}

}  // namespace

void run_convert(const ConvertArgs& a) {
  if (a.print_policy) {
    std::printf("%s", convert::default_policy_text().c_str());
    return;
  }
  check(!a.type.empty(), "convert: give the storage type with -t q4|q8|bf16|f16|f32|keep");
  check(!a.output.empty(), "convert: give the output file with -o FILE");
  check(a.alignment_kib >= 64 && (a.alignment_kib & (a.alignment_kib - 1)) == 0, "--align-kib ",
        a.alignment_kib, ": expected a power of two >= 64");
  convert::ConvertOptions o;
  o.source = a.paths;
  o.output = a.output;
  o.keep = a.type == "keep";
  o.keep_llm = a.keep_llm;
  o.safety_model = a.safety_model;
  o.controlnet = a.controlnet;
  if (!a.tiny_vae.empty())
    o.extra_components.push_back([path = a.tiny_vae](const ModelConfig& config) {
      return tiny_vae_component(path, "--tiny-vae", config);
    });
  if (!o.keep) o.target = convert::parse_storage_type(a.type, "-t");
  if (!a.policy.empty()) {
    o.policy_text = read_text_file(a.policy);
    o.policy_origin = a.policy;
  }
  o.alignment = uint64_t(a.alignment_kib) << 10;
  o.threads = a.threads;
  o.cancel = &g_cancel;
  o.arrival = a.arrival;
  for (const auto& text : a.loras) o.loras.push_back(parse_lora_argument(text));
  if (!a.quiet) o.stage = [](const std::string& s) { std::fprintf(stderr, "%s\n", s.c_str()); };
  o.on_temp_file = [](const std::filesystem::path& p) {
    std::strncpy(g_temp_path, p.c_str(), sizeof g_temp_path - 1);
  };
  if (a.on_progress) o.progress = a.on_progress;
  else if (!a.quiet) o.progress = [](const convert::ConvertProgress& p) {
    const double rate = p.seconds > 0 ? double(p.source_bytes) / 1e6 / p.seconds : 0;
    std::fprintf(stderr, "[%3zu/%zu] %-28s read %10s  wrote %10s  %7.1f MB/s\n", p.unit, p.units,
                 p.name.c_str(), mb(p.source_bytes).c_str(), mb(p.written_bytes).c_str(), rate);
  };
  g_cancel = false;
  InterruptGuard guard;
  const convert::ConvertSummary s = convert::convert_model(o);
  if (a.quiet) return;
  std::fprintf(stderr,
               "wrote %s: %s, %zu units, %zu tensors (%zu dropped) in %.1f s "
               "(source checksums: %.1f s, alongside)\n",
               s.output.c_str(), mb(s.file_bytes).c_str(), s.units, s.tensors, s.dropped,
               s.convert_seconds, s.hash_seconds);
  for (const auto& [type, t] : s.by_type)
    std::fprintf(stderr, "  %-5s %5zu tensors  %12llu parameters  %s\n", type.c_str(), t.tensors,
                 static_cast<unsigned long long>(t.parameters), mb(t.bytes).c_str());
}

static Registration convert_command("convert", 10, [](CLI::App& app) {
  auto a = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert", "Convert a checkpoint (" + family_titles() + ") into one klein container file");
  add_model_options(*cmd, a->paths);
  cmd->add_option("-o,--output", a->output, "the container file to write");
  cmd->add_option("-t,--type", a->type,
                  "storage type of the weight matrices: q4, q8, bf16, f16 or f32 (the policy "
                  "keeps sensitive tensors at higher precision), or keep: each tensor keeps its "
                  "precision class (f32, bf16, f16 stay; fp8 becomes q8, whose 8-bit steps per "
                  "block of 32 are finer than fp8's 3-bit mantissa on the large values, at 8.5 "
                  "bits a value; bf16 would be exact at twice the size)");
  cmd->add_option("--policy", a->policy,
                  "precision policy file: lines \"<glob|re:regex|@1d> <type|>=type>\", first "
                  "match wins, before the built-in defaults");
  cmd->add_flag("--print-policy", a->print_policy, "print the built-in policy and exit");
  cmd->add_option("--align-kib", a->alignment_kib, "unit alignment in KiB (power of two >= 64)")
      ->capture_default_str();
  cmd->add_option("--threads", a->threads, "packing threads (default: all)");
  cmd->add_option("--lora", a->loras,
                  "merge a LoRA into the transformer before storing it, FILE or FILE:SCALE; "
                  "repeat for several (recorded in the container)")
      ->type_name("FILE[:SCALE]");
  cmd->add_flag("--keep-llm", a->keep_llm,
                 "keep the text encoder's later layers, final norm and lm_head, which image "
                 "generation does not read but prompt upsampling (--upsample) does");
  cmd->add_option("--safety-model", a->safety_model,
                  "store the safety classifier of this Hugging Face directory (Falconsai/"
                  "nsfw_image_detection) beside the model, by the same policy: `generate "
                  "--safety` and `serve` then use it")
      ->type_name("DIR");
  cmd->add_option("--controlnet", a->controlnet,
                  "store this control model beside the model, by the same policy (Z-Image: "
                  "Z-Image-Turbo-Fun-Controlnet-Union 2.1, a diffusers directory or the original "
                  ".safetensors): `generate --control-image` and `serve` then use it")
      ->type_name("PATH");
  cmd->add_option("--tiny-vae", a->tiny_vae,
                  "store this tiny autoencoder's decoder beside the model, exactly (madebyollin/"
                  "taesd: taef2_decoder.pth for FLUX.2, taef1_decoder.pth for Z-Image, a "
                  ".safetensors copy, or a directory holding one): previews and `generate "
                  "--decoder tiny` then use it")
      ->type_name("FILE|DIR");
  cmd->add_flag("-q,--quiet", a->quiet, "no progress output (errors are still printed)");
  cmd->callback([a] { run_convert(*a); });
});

}  // namespace klein::cli
