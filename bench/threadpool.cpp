// What one parallel loop of the thread pool costs beyond its work: loops of one task per
// thread, each task `work` microseconds of busy waiting, one after the other as the loops of
// a transformer step are (a klein-4B step at 256x256 is about 740 of them; `klein bench step`
// prints the count). The reported "overhead_us" is the time per loop minus the work of one
// task: waking the workers, handing out the tasks and waiting for the last one.
//
//   build/bench/bench_threadpool [--benchmark_repetitions=3]
//
// Names: loop/threads:<T>/work_us:<W>.
#include <benchmark/benchmark.h>

#include <chrono>

#include "core/cpu.h"
#include "core/threadpool.h"

namespace {

using namespace klein;

void busy_for(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

void loop(benchmark::State& state) {
  const int threads = int(state.range(0));
  const std::chrono::microseconds work(state.range(1));
  ThreadPool pool(threads);
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) pool.for_each_task(threads, [&](int64_t, int) { busy_for(work); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.counters["overhead_us"] =
      state.iterations() ? seconds * 1e6 / double(state.iterations()) - double(work.count()) : 0;
}

const bool registered = [] {
  for (int threads : {2, 4, 8, 16}) {
    if (threads > usable_cpus()) break;
    for (int work_us : {0, 20, 200})
      benchmark::RegisterBenchmark("loop", loop)
          ->ArgNames({"threads", "work_us"})
          ->Args({threads, work_us})
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
  }
  return true;
}();

}  // namespace
BENCHMARK_MAIN();
