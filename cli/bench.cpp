// klein bench matmul: throughput of the matmul kernels on the model's shapes, for every weight
// type and the instruction sets asked for, with OpenBLAS sgemm on float32 weights measured in
// the same run (the machine may be shared: only same-run ratios are meaningful).
// klein bench peak: the multiply-add rate of the instruction each integer kernel is built on.
// klein bench step: one denoising step of a model at a size, its work, and the fraction of
// that peak it reaches (pipeline/step_bench.h).
#include <algorithm>
#include <cctype>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/support/matmul_bench.h"
#include "cli/memory_options.h"
#include "cli/model_options.h"
#include "cli/commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/memory.h"
#include "ops/compute.h"
#include "pipeline/memory_plan.h"
#include "pipeline/pipeline.h"
#include "pipeline/stages.h"
#include "pipeline/step_bench.h"
#include "quant/peak.h"
#include "weights/model_source.h"

namespace klein::cli {
namespace {

struct BenchMatmulArgs {
  bool full = false;
  bool json = false;
  bool all_isas = false;
  std::vector<std::string> types;
  std::vector<int64_t> rows;  // M values to keep (empty: all)
  double min_seconds = 0.3;
  int threads = 0;
};

DType parse_type(const std::string& name) {
  std::string lower;
  for (DType t : {DType::F32, DType::BF16, DType::F16, DType::Q8, DType::Q4}) {
    std::string n(dtype_name(t));
    for (char& c : n) c = char(std::tolower(c));
    if (name == n) return t;
    lower += (lower.empty() ? "" : ", ") + n;
  }
  fail("--type: unknown weight type '", name, "' (expected one of ", lower, ")");
}

void print_table(const std::vector<bench::MatmulBenchRow>& rows) {
  std::printf("%-5s %-7s %5s %6s %6s %10s %9s %9s %7s %10s\n", "type", "isa", "M", "N", "K",
              "ms/call", "GOP/s", "sgemm", "x sgemm", "GB/s (W)");
  for (const auto& r : rows) {
    std::printf("%-5s %-7s %5lld %6lld %6lld %10.3f %9.1f %9.1f %7.2f", std::string(dtype_name(r.type)).c_str(),
                std::string(quant::isa_name(r.isa)).c_str(), (long long)r.shape.M,
                (long long)r.shape.N, (long long)r.shape.K, r.seconds * 1e3, r.gops, r.sgemm_gops,
                r.sgemm_gops > 0 ? r.gops / r.sgemm_gops : 0.0);
    if (r.shape.M == 1)
      std::printf(" %6.1f (%.0f%% of copy %.1f)", r.weight_gbps,
                  100.0 * r.weight_gbps / r.copy_gbps, r.copy_gbps);
    std::printf("\n");
  }
}

void print_json(const std::vector<bench::MatmulBenchRow>& rows, int threads) {
  nlohmann::json out;
  out["cpu"] = describe(cpu_features());
  out["threads"] = threads;
  for (const auto& r : rows) {
    nlohmann::json j{{"type", std::string(dtype_name(r.type))},
                     {"isa", std::string(quant::isa_name(r.isa))},
                     {"M", r.shape.M},
                     {"N", r.shape.N},
                     {"K", r.shape.K},
                     {"seconds", r.seconds},
                     {"gops", r.gops},
                     {"sgemm_gops", r.sgemm_gops},
                     {"weight_gbps", r.weight_gbps}};
    if (r.shape.M == 1) j["copy_gbps"] = r.copy_gbps;
    out["rows"].push_back(j);
  }
  std::printf("%s\n", out.dump(2).c_str());
}

void run_bench_matmul(const BenchMatmulArgs& a) {
  check(a.min_seconds > 0, "--min-seconds must be positive, got ", a.min_seconds);
  const int threads = a.threads > 0 ? a.threads : usable_cpus();
  bench::MatmulBenchOptions o;
  if (!a.types.empty()) {
    o.types.clear();
    for (const auto& t : a.types) o.types.push_back(parse_type(t));
  }
  o.isas = a.all_isas ? quant::available_isas() : std::vector<quant::Isa>{quant::best_isa()};
  for (const auto& s : bench::matmul_bench_shapes(a.full))
    if (a.rows.empty() || std::find(a.rows.begin(), a.rows.end(), s.M) != a.rows.end())
      o.shapes.push_back(s);
  check(!o.shapes.empty(), "--rows: no benchmark shape has that M (the shapes use M = 1, 768, ",
        "1536, 4608)");
  o.min_seconds = a.min_seconds;
  o.sgemm = bench::openblas_sgemm(threads);
  if (!a.json)
    std::fprintf(stderr, "matmul on %s, %d threads, %zu shapes x %zu types x %zu instruction sets\n",
                 describe(cpu_features()).c_str(), threads, o.shapes.size(), o.types.size(),
                 o.isas.size());
  const auto rows = bench::run_matmul_bench(o, threads);
  if (a.json) {
    print_json(rows, threads);
  } else {
    print_table(rows);
  }
}

struct BenchPeakArgs {
  bool all_isas = false;
  bool json = false;
  int threads = 0;
  double seconds = 0.3;
};

void run_bench_peak(const BenchPeakArgs& a) {
  check(a.seconds > 0, "--seconds must be positive, got ", a.seconds);
  nlohmann::json out;
  out["cpu"] = describe(cpu_features());
  const std::vector<quant::Isa> isas =
      a.all_isas ? quant::available_isas() : std::vector<quant::Isa>{quant::best_isa()};
  for (quant::Isa isa : isas) {
    Compute cx(a.threads, isa);
    const quant::PeakRate r = quant::measure_peak(isa, cx.pool(), a.seconds);
    out["threads"] = r.threads;
    if (a.json) {
      out["peaks"].push_back({{"isa", std::string(quant::isa_name(isa))},
                              {"instruction", std::string(r.instruction)},
                              {"threads", r.threads},
                              {"gmacs", r.macs_per_second / 1e9}});
    } else if (r.macs_per_second > 0) {
      std::printf("%-7s %-34s %2d threads %9.1f GMAC/s\n", std::string(quant::isa_name(isa)).c_str(),
                  std::string(r.instruction).c_str(), r.threads, r.macs_per_second / 1e9);
    } else {
      std::printf("%-7s %-34s (the reference path: no peak)\n",
                  std::string(quant::isa_name(isa)).c_str(), "-");
    }
  }
  if (a.json) std::printf("%s\n", out.dump(2).c_str());
}

struct BenchStepArgs {
  ModelPaths paths;
  int64_t width = 256, height = 256;
  int forwards = 3;
  int threads = 0;
  Precision precision = Precision::Auto;
  MemoryOptions memory;
  bool json = false;
};

void run_bench_step(const BenchStepArgs& a) {
  auto store = open_model(a.paths);
  MemoryPlanInputs need = stages_for(store->config()).memory_inputs(store->config());
  need.width = a.width;
  need.height = a.height;
  need.text_encoder = false;
  const MemoryPlan plan = plan_memory(estimate_memory(*store, need), a.memory.budget(),
                                      available_memory_bytes(), a.memory.forced());
  store->set_residency(plan.residency);
  Compute cx(a.threads);
  const bool fast = runs_fast(a.precision, *store);  // as a generation decides it
  cx.arithmetic = arithmetic_for(fast);
  if (!a.json)
    std::fprintf(stderr, "%s, %d threads, %s path, %s precision; %lldx%lld, %d forwards (%s)\n",
                 describe(cpu_features()).c_str(), cx.threads(),
                 std::string(quant::isa_name(cx.isa())).c_str(), precision_name(fast),
                 (long long)a.width, (long long)a.height, a.forwards, plan.reason.c_str());
  const StepBench b = bench_step(*store, a.width, a.height, a.forwards, cx);
  if (a.json) {
    nlohmann::json j{{"cpu", describe(cpu_features())},
                     {"isa", std::string(quant::isa_name(cx.isa()))},
                     {"threads", cx.threads()},
                     {"precision", precision_name(fast)},
                     {"width", b.width},
                     {"height", b.height},
                     {"residency", residency_name(plan.residency)},
                     {"forward_seconds", b.forward_seconds},
                     {"steady_seconds", b.steady_seconds()},
                     {"linear_macs", b.work.linear_macs},
                     {"attention_macs", b.work.attention_macs},
                     {"peak_instruction", std::string(b.peak.instruction)},
                     {"peak_gmacs", b.peak.macs_per_second / 1e9},
                     {"linear_gmacs", b.linear_rate() / 1e9},
                     {"peak_fraction", b.peak_fraction()},
                     {"forward_loops", b.forward_loops},
                     {"forward_wait_seconds", b.forward_wait_seconds},
                     {"forward_acquire_seconds", b.forward_acquire_seconds},
                     {"peak_rss_bytes", peak_rss_bytes()}};
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("forwards (s):          ");
  for (double t : b.forward_seconds) std::printf(" %.3f", t);
  std::printf("\nsteady forward:         %.3f s (median after the first)\n", b.steady_seconds());
  std::printf("work per forward:       %.1f GMAC in the linear layers, %.1f GMAC in attention\n",
              b.work.linear_macs / 1e9, b.work.attention_macs / 1e9);
  std::printf("linear rate:            %.1f GMAC/s\n", b.linear_rate() / 1e9);
  if (b.peak.macs_per_second > 0) {
    std::printf("peak (%s): %.1f GMAC/s on %d threads\n", std::string(b.peak.instruction).c_str(),
                b.peak.macs_per_second / 1e9, b.peak.threads);
    std::printf("fraction of the peak:   %.1f %% (the linear layers alone would take %.3f s at it)\n",
                100 * b.peak_fraction(), b.work.linear_macs / b.peak.macs_per_second);
  } else {
    std::printf("peak:                   none (the scalar reference path)\n");
  }
  const size_t last = b.forward_loops.size() - 1;
  std::printf("thread loops:           %lld per forward, the caller waiting %.3f s at their ends "
              "(last forward)\n",
              (long long)b.forward_loops[last], b.forward_wait_seconds[last]);
  std::printf("acquiring weights:      %.3f s (last forward: checks of pages that came in, waits "
              "for the read-ahead)\n",
              b.forward_acquire_seconds[last]);
  std::printf("peak RSS:               %s\n", format_bytes(peak_rss_bytes()).c_str());
}

}  // namespace

static Registration bench_command("bench", 60, [](CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Measure the speed of the kernels");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchMatmulArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "matmul", "GOP/s of every weight type on the model's matrix shapes, against OpenBLAS sgemm");
  cmd->add_flag("--full", a->full, "every shape of the issue's grid (slow), not a subset");
  cmd->add_flag("--all-isas", a->all_isas,
                "every instruction set this CPU has (scalar, avx2, ...), not only the best");
  cmd->add_option("-t,--type", a->types, "weight types to measure: f32 bf16 f16 q8 q4 (default all)");
  cmd->add_option("--rows", a->rows, "only these M (tokens): 1, 768, 1536, 4608");
  cmd->add_option("--min-seconds", a->min_seconds, "time per measurement (best of 3)");
  cmd->add_option("--threads", a->threads, "worker threads (default: all cores)");
  cmd->add_flag("--json", a->json, "results as JSON on stdout");
  cmd->callback([a] { run_bench_matmul(*a); });

  auto p = std::make_shared<BenchPeakArgs>();
  CLI::App* peak = bench->add_subcommand(
      "peak", "Multiply-adds per second of the instruction the integer kernels are built on");
  peak->add_flag("--all-isas", p->all_isas, "every instruction set this CPU has, not only the best");
  peak->add_option("--threads", p->threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  peak->add_option("--seconds", p->seconds, "time per measurement (best of 5)");
  peak->add_flag("--json", p->json, "results as JSON on stdout");
  peak->callback([p] { run_bench_peak(*p); });

  auto s = std::make_shared<BenchStepArgs>();
  CLI::App* step = bench->add_subcommand(
      "step", "One denoising step of a model: its time, its work and the fraction of the peak");
  add_model_options(*step, s->paths);
  step->add_option("-W,--width", s->width, "image width in pixels (multiple of 16; default 256)");
  step->add_option("-H,--height", s->height, "image height in pixels (multiple of 16; default 256)");
  step->add_option("--forwards", s->forwards,
                   "transformer forwards to time; the first pages the weights in (default 3)")
      ->check(CLI::PositiveNumber);
  step->add_option("--threads", s->threads, "worker threads (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  add_precision_option(*step, s->precision);
  add_memory_options(*step, s->memory);
  step->add_flag("--json", s->json, "the result as JSON on stdout");
  step->callback([s] { run_bench_step(*s); });
});

}  // namespace klein::cli
