// klein bench matmul: throughput of the matmul kernels on the model's shapes, for every weight
// type and the instruction sets asked for, with OpenBLAS sgemm on float32 weights measured in
// the same run (the machine may be shared: only same-run ratios are meaningful).
#include <algorithm>
#include <cctype>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/support/matmul_bench.h"
#include "cli/commands.h"
#include "core/cpu.h"
#include "core/error.h"

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

}  // namespace

static Registration reg("bench", 60, [](CLI::App& app) {
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
});

}  // namespace klein::cli
