// Packing float32 weights into each storage type, as `klein convert` does per slice of rows:
// weights per second on one thread, for a matrix of the model's shape (3072 x 3072, the 4B's
// attention projections), random Gaussian values.
//
//   build/bench/bench_quantize [--benchmark_filter=<regex>] [--benchmark_repetitions=3]
//
// Names: pack/<type>. The figure that matters is items_per_second (weights per second); the
// 4B model and its text encoder hold ~7.7e9 weights, so 1 G/s per thread is ~4 s of packing
// on two threads.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "quant/matmul.h"
#include "quant/types.h"

namespace {

using namespace klein;
using namespace klein::quant;

constexpr int64_t kRows = 3072, kCols = 3072;

const std::vector<float>& weights() {
  static const std::vector<float> w = [] {
    std::vector<float> v(size_t(kRows * kCols));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& x : v) x = normal(rng);
    return v;
  }();
  return w;
}

void pack_type(benchmark::State& state, DType type) {
  const std::vector<float>& w = weights();
  const Layout layout = preferred_layout(type);
  std::vector<uint8_t> out(storage_bytes(type, layout, kRows, kCols));
  for (auto _ : state) {
    pack(w.data(), kRows, kCols, type, layout, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * kRows * kCols);
}

}  // namespace

BENCHMARK_CAPTURE(pack_type, q4, DType::Q4)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(pack_type, q8, DType::Q8)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(pack_type, bf16, DType::BF16)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
