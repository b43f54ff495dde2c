#include "quant/peak.h"

#include <atomic>
#include <chrono>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/threadpool.h"

namespace klein::quant {
namespace {

using LoopFn = int64_t (*)(int64_t);

struct Loop {
  LoopFn fn = nullptr;
  std::string_view instruction;
};

Loop loop_for(Isa isa) {
  switch (isa) {
#if defined(KLEIN_X86)
    case Isa::Avx2:
      if (cpu_features().avx_vnni) return {detail::peak_loop_avxvnni, "vpdpbusd (ymm, avx-vnni)"};
      return {detail::peak_loop_avx2, "vpmaddubsw x2 + vpmaddwd (ymm)"};
    case Isa::Avx512: return {detail::peak_loop_avx512, "vpdpbusd (zmm)"};
    case Isa::Amx: return {detail::peak_loop_amx, "tdpbf16ps (16x32x16 bf16 tiles)"};
#elif defined(KLEIN_ARM64)
    case Isa::Neon:
      if (cpu_features().neon_i8mm) return {detail::peak_loop_neon_i8mm, "smmla (v.4s)"};
      return {detail::peak_loop_neon, "sdot (v.4s)"};
#endif
    default: return {};
  }
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

PeakRate measure_peak(Isa isa, ThreadPool& pool, double seconds) {
  check(isa != Isa::Auto && isa_available(isa), "measure_peak: the ", isa_name(isa),
        " path cannot run on this CPU");
  PeakRate r;
  r.isa = isa;
  r.threads = pool.size();
  const Loop loop = loop_for(isa);
  if (loop.fn == nullptr) return r;
  r.instruction = loop.instruction;
  // Calibrate on one thread: the rounds that take about a tenth of the time asked for.
  int64_t rounds = 1024;
  for (;;) {
    const double t0 = now();
    loop.fn(rounds);
    const double dt = now() - t0;
    if (dt > seconds / 10 || rounds > (int64_t(1) << 40)) {
      rounds = std::max<int64_t>(1, int64_t(double(rounds) * (seconds / 10) / std::max(dt, 1e-9)));
      break;
    }
    rounds *= 4;
  }
  // Best of five: every thread runs the loop at the same time, each timed on its own.
  const int n = pool.size();
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> rate(size_t(n), 0.0);
    pool.for_each_task(n, [&](int64_t task, int) {
      const double t0 = now();
      const int64_t macs = loop.fn(rounds * 2);
      rate[size_t(task)] = double(macs) / (now() - t0);
    });
    double sum = 0;
    for (double x : rate) sum += x;
    r.macs_per_second = std::max(r.macs_per_second, sum);
  }
  return r;
}

}  // namespace klein::quant
