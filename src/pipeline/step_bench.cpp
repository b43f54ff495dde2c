#include "pipeline/step_bench.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "ops/compute.h"
#include "pipeline/stages.h"

namespace klein {

double StepBench::steady_seconds() const {
  check(!forward_seconds.empty(), "StepBench: no forward was timed");
  if (forward_seconds.size() == 1) return forward_seconds[0];
  std::vector<double> t(forward_seconds.begin() + 1, forward_seconds.end());
  std::sort(t.begin(), t.end());
  const size_t n = t.size();
  return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

StepBench bench_step(WeightStore& store, int64_t width, int64_t height, int forwards, Compute& cx) {
  check(forwards >= 1, "--forwards must be at least 1, got ", forwards);
  check(width >= 16 && height >= 16 && width % 16 == 0 && height % 16 == 0,
        "-W/-H: the size must be a multiple of 16 pixels a side, at least 16, got ", width, "x",
        height);
  const ModelConfig& config = store.config();
  const FamilyStages& stages = stages_for(config);
  const LatentGrid grid{height / 16, width / 16};
  StepBench b;
  b.width = width;
  b.height = height;
  b.work = stages.forward_work(config, grid);
  // The peak first, on the same threads, before the forwards warm the machine up.
  b.peak = quant::measure_peak(cx.isa(), cx.pool());
  const SyntheticProbe probe = stages.synthetic_probe(config, grid);
  const ProbeInputs in = probe.inputs();
  // Prepared as the sampler prepares its steps (the context embedded, the modulation, the
  // weights outside the blocks kept): each timed forward is what one step of a generation runs.
  const std::unique_ptr<FamilyStages::Probe> run = stages.start_probe(store, in, cx);
  for (int i = 0; i < forwards; ++i) {
    const ThreadPool::Stats before = cx.pool().stats();
    const double acquire_before = store.residency_stats().acquire_seconds;
    const auto t0 = std::chrono::steady_clock::now();
    run->forward({});
    b.forward_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const ThreadPool::Stats after = cx.pool().stats();
    b.forward_loops.push_back(after.jobs - before.jobs);
    b.forward_wait_seconds.push_back(after.caller_wait_seconds - before.caller_wait_seconds);
    b.forward_acquire_seconds.push_back(store.residency_stats().acquire_seconds - acquire_before);
  }
  return b;
}

}  // namespace klein
