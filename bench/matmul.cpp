// Matmul kernels: GOP/s per weight type and instruction set on the model's shapes, with
// OpenBLAS sgemm on float32 weights measured in the same run, and for M = 1 the weight
// bandwidth against memcpy bandwidth.
//
//   build-quant/bench/bench_matmul [--full] [--benchmark_filter=<regex>] [--benchmark_repetitions=3]
//
// Names: matmul/<type>/<isa>/M<M>/N<N>/K<K> and sgemm/M<M>/N<N>/K<K>. Without --full, a
// representative subset (bench/support/matmul_bench.h). Every type goes through ops::linear,
// the engine's path. Threads: KLEIN_THREADS (default: the usable CPUs).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "bench/support/matmul_bench.h"
#include "ops/compute.h"
#include "quant/matmul.h"

namespace {

using namespace klein;
using namespace klein::bench;
using namespace klein::quant;

constexpr size_t kMatVecBytes = size_t(1) << 30;

int thread_count() {
  const char* t = std::getenv("KLEIN_THREADS");
  return t ? std::atoi(t) : 0;
}

// A compute context per instruction set, made on first use.
Compute& context(Isa isa) {
  static std::map<Isa, std::unique_ptr<Compute>> contexts;
  auto& cx = contexts[isa];
  if (!cx) cx = std::make_unique<Compute>(thread_count(), isa);
  return *cx;
}

ThreadPool& pool() { return context(best_isa()).pool(); }

// The benchmarks run grouped by shape and type, so one cached entry of each kind is enough
// (and the whole grid would not fit in memory at once).
const std::vector<float>& float_weights(int64_t N, int64_t K) {
  static std::pair<int64_t, int64_t> key{-1, -1};
  static std::vector<float> w;
  if (key != std::pair{N, K}) {
    w.clear();
    w = bench_float_weights(N, K, uint32_t(N * 31 + K));
    key = {N, K};
  }
  return w;
}

BenchWeights& weights(DType type, int64_t N, int64_t K, bool rotate) {
  static std::tuple<DType, int64_t, int64_t, bool> key{DType::F32, -1, -1, false};
  static std::unique_ptr<BenchWeights> w;
  if (key != std::tuple{type, N, K, rotate}) {
    w.reset();
    w = std::make_unique<BenchWeights>(float_weights(N, K).data(), type, N, K,
                                       rotate ? kMatVecBytes : 0, pool());
    key = {type, N, K, rotate};
  }
  return *w;
}

void sgemm(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
  static const SgemmFn blas = openblas_sgemm(thread_count());
  blas(x, M, w, N, K, y);
}

double sgemm_gops(MatmulShape s) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, double> cache;
  auto [it, fresh] = cache.try_emplace({s.M, s.N, s.K}, 0.0);
  if (fresh) {
    const auto& w = float_weights(s.N, s.K);
    const std::vector<float> x = bench_float_weights(s.M, s.K, 7);
    std::vector<float> y(size_t(s.M * s.N));
    const double t = time_per_call([&] { sgemm(x.data(), s.M, w.data(), s.N, s.K, y.data()); }, 0.3);
    it->second = 2.0 * double(s.M * s.N) * double(s.K) / t / 1e9;
  }
  return it->second;
}

double copy_gbps() {
  static const double gbps = measure_copy_bandwidth(pool(), kMatVecBytes);
  return gbps;
}

// Times each call itself (manual time), so the counters can be derived from the same numbers.
template <class Fn>
double run_timed(benchmark::State& state, Fn&& fn) {
  fn();  // warm-up
  double total = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(t);
    total += t;
  }
  return total / double(state.iterations());
}

void bm_matmul(benchmark::State& state, DType type, Isa isa, MatmulShape s) {
  BenchWeights& w = weights(type, s.N, s.K, s.M == 1);
  const std::vector<float> x = bench_float_weights(s.M, s.K, 7);
  std::vector<float> y(size_t(s.M * s.N));
  Compute& cx = context(isa);
  const double t = run_timed(state, [&] { bench_linear(x.data(), s.M, w.next(), y.data(), cx); });
  const double gops = 2.0 * double(s.M * s.N) * double(s.K) / t / 1e9;
  state.counters["GOPS"] = gops;
  state.counters["sgemm_GOPS"] = sgemm_gops(s);
  state.counters["x_sgemm"] = gops / sgemm_gops(s);
  if (s.M == 1) {
    const double gbps = double(w.bytes_per_matrix()) / t / 1e9;
    state.counters["weight_GBps"] = gbps;
    state.counters["copy_GBps"] = copy_gbps();
    state.counters["of_copy"] = gbps / copy_gbps();
  }
}

void bm_sgemm(benchmark::State& state, MatmulShape s) {
  const auto& w = float_weights(s.N, s.K);
  const std::vector<float> x = bench_float_weights(s.M, s.K, 7);
  std::vector<float> y(size_t(s.M * s.N));
  const double t = run_timed(state, [&] { sgemm(x.data(), s.M, w.data(), s.N, s.K, y.data()); });
  state.counters["GOPS"] = 2.0 * double(s.M * s.N) * double(s.K) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bool full = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--full") == 0) {
      full = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  for (const MatmulShape& s : matmul_bench_shapes(full)) {
    const std::string dims = "/M" + std::to_string(s.M) + "/N" + std::to_string(s.N) + "/K" +
                             std::to_string(s.K);
    benchmark::RegisterBenchmark(("sgemm" + dims).c_str(), bm_sgemm, s)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    for (DType type : {DType::F32, DType::BF16, DType::F16, DType::Q8, DType::Q4}) {
      for (Isa isa : available_isas()) {
        if (isa == Isa::Scalar) continue;  // minutes per shape; run it with a filter if wanted
        const std::string name = "matmul/" + std::string(dtype_name(type)) + "/" +
                                 std::string(isa_name(isa)) + dims;
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, isa, s)
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
