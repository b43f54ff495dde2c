#pragma once
// How close a denoising step comes to the machine's peak (klein bench step): the transformer
// forward of one step at a given size on made-up inputs of the right shapes, timed a few
// times; the multiply-adds it does (the family's forward_work); and the peak rate of the
// instruction the integer kernels use (quant/peak.h), measured on the same threads.
//
// The fraction reported is the linear layers' multiply-adds per second of the steady forward
// (every forward after the first, which pages the weights in) over that peak: the time spent
// on anything but those products (attention, norms, activations, unpacking, paging, waiting)
// lowers it. A klein step is one forward (a guided klein-base step two, a Z-Image CFG step two).
#include <cstdint>
#include <vector>

#include "ops/work.h"
#include "quant/peak.h"
#include "weights/weight_store.h"

namespace klein {

class Compute;

struct StepBench {
  int64_t width = 0, height = 0;
  ops::ForwardWork work;
  std::vector<double> forward_seconds;  // each forward, the first included
  // Per forward: the parallel loops handed to the thread pool (each one a synchronisation of
  // every thread), and the time the calling thread waited at their ends for the others
  // (ThreadPool::Stats). Both 0 on one thread.
  std::vector<int64_t> forward_loops;
  std::vector<double> forward_wait_seconds;
  // Per forward: the time the forward spent acquiring its weight units (ResidencyStats::
  // acquire_seconds: checks of pages that came in, waits for the read-ahead's check).
  std::vector<double> forward_acquire_seconds;
  quant::PeakRate peak;

  double steady_seconds() const;  // median of the forwards after the first (the first if alone)
  double linear_rate() const { return work.linear_macs / steady_seconds(); }
  double peak_fraction() const {
    return peak.macs_per_second > 0 ? linear_rate() / peak.macs_per_second : 0;
  }
};

// `forwards` >= 1; width and height are settled as a generation would (multiples of 16).
StepBench bench_step(WeightStore& store, int64_t width, int64_t height, int forwards, Compute& cx);

}  // namespace klein
