// ops::swiglu on one MLP's worth of values of a 4B step at 256x256 (768 tokens x 9216), one
// thread, per instruction set the CPU has (scalar: libm's expf per value).
//
//   build/bench/bench_activations [--benchmark_repetitions=3]
//
// Names: swiglu/<isa>; items/s counts values.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "ops/compute.h"
#include "ops/norm.h"

namespace {

using namespace klein;

void swiglu(benchmark::State& state, quant::Isa isa) {
  const int64_t n = 768 * 9216;
  std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n), 1.0f),
      out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) gate[size_t(i)] = float(i % 1000) * 0.01f - 5.0f;
  Compute cx(1, isa);
  for (auto _ : state) {
    ops::swiglu(gate.data(), up.data(), out.data(), n, cx);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}

const bool registered = [] {
  for (quant::Isa isa : quant::available_isas())
    benchmark::RegisterBenchmark(("swiglu/" + std::string(quant::isa_name(isa))).c_str(), swiglu,
                                 isa)
        ->Unit(benchmark::kMillisecond);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
