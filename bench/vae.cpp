// VAE speed and memory at klein's real shapes (channels [128, 256, 512, 512]) with random BF16
// weights (tests/vae/random_store.h); the numbers do not depend on the weight values.
//
//   bench_vae [--benchmark_filter=<regex>]   Google Benchmark: decode, encode, single convs
//   bench_vae --peak decode 1024             one 1024x1024 decode: time per stage, peak RSS
//   bench_vae --peak encode 1024             the same for an encode
//
// Threads: KLEIN_THREADS (default: all cores).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "models/vae/vae.h"
#include "ops/conv2d.h"
#include "tests/vae/random_store.h"

namespace {

using namespace klein;

int thread_count() {
  const char* t = std::getenv("KLEIN_THREADS");
  return t ? std::atoi(t) : 0;
}

ThreadPool& pool() {
  static ThreadPool p(thread_count());
  return p;
}

testing::RandomVaeStore& store() {
  static testing::RandomVaeStore s;
  return s;
}

Tensor random_tensor(Shape shape, float scale = 1.0f) {
  Tensor t(std::move(shape));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = normal(rng);
  return t;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

void BM_Decode(benchmark::State& state) {
  const int64_t side = state.range(0);
  vae::Vae model(store(), pool());
  const Tensor tokens = random_tensor({(side / 16) * (side / 16), 128});
  for (auto _ : state) benchmark::DoNotOptimize(model.decode(tokens, side / 16, side / 16));
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}
BENCHMARK(BM_Decode)->Arg(256)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Encode(benchmark::State& state) {
  const int64_t side = state.range(0);
  vae::Vae model(store(), pool());
  const Tensor pixels = random_tensor({3, side, side}, 0.5f);
  for (auto _ : state) benchmark::DoNotOptimize(model.encode(pixels));
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}
BENCHMARK(BM_Encode)->Arg(256)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

// One 3×3 convolution with the fused GroupNorm + SiLU input, as in every ResNet:
// args = channels in, channels out, side, algorithm (0 im2col + GEMM, 1 direct).
void BM_Conv3x3(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1), side = state.range(2);
  ops::Conv2dParams p = ops::Conv2dParams::same(3);
  p.algorithm = state.range(3) ? ops::ConvAlgorithm::Direct : ops::ConvAlgorithm::Gemm;
  if (state.range(3) && !ops::conv2d_direct_available()) return state.SkipWithError("no direct kernel");
  const Tensor x = random_tensor({in, side, side});
  ops::Conv2dWeights w;
  w.out_channels = out;
  w.in_channels = in;
  w.kernel = 3;
  w.weight = std::vector<float>(size_t(out * in * 9), 0.01f);
  w.bias = std::vector<float>(size_t(out), 0.0f);
  ops::ChannelAffine norm;
  norm.mean.assign(size_t(in), 0.0f);
  norm.scale.assign(size_t(in), 1.0f);
  norm.shift.assign(size_t(in), 0.0f);
  norm.silu = true;
  for (auto _ : state)
    benchmark::DoNotOptimize(ops::conv2d(x, w, p, pool(), &norm));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(out * in * 9 * side * side),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Conv3x3)
    ->ArgsProduct({{128}, {128}, {512}, {0, 1}})
    ->ArgsProduct({{256}, {128}, {512}, {0, 1}})
    ->ArgsProduct({{512}, {512}, {128}, {0, 1}})
    ->ArgsProduct({{128}, {3}, {512}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One full-size run, printing the time spent up to each reported intermediate and the peak
// resident memory (weights included: 84M BF16 parameters = 160 MiB).
int peak_run(const std::string& what, int64_t side) {
  vae::Vae model(store(), pool());
  const double weights_rss = peak_rss_mib();
  using clock = std::chrono::steady_clock;
  auto last = clock::now();
  const auto start = last;
  vae::Observer timer = [&](const std::string& name, const Tensor& t) {
    const auto now = clock::now();
    std::printf("  %-24s %-18s %8.2f s   peak RSS %7.0f MiB\n", name.c_str(),
                shape_str(t.shape()).c_str(), std::chrono::duration<double>(now - last).count(),
                peak_rss_mib());
    last = clock::now();  // exclude the printing
  };
  std::printf("%s %lldx%lld, %d threads; RSS with weights resident: %.0f MiB\n", what.c_str(),
              (long long)side, (long long)side, pool().size(), weights_rss);
  if (what == "decode") {
    const Tensor tokens = random_tensor({(side / 16) * (side / 16), 128});
    model.decode(tokens, side / 16, side / 16, timer);
  } else if (what == "encode") {
    const Tensor pixels = random_tensor({3, side, side}, 0.5f);
    model.encode(pixels, timer);
  } else {
    std::fprintf(stderr, "--peak expects decode or encode, got %s\n", what.c_str());
    return 2;
  }
  std::printf("total %.2f s, peak RSS %.0f MiB\n",
              std::chrono::duration<double>(clock::now() - start).count(), peak_rss_mib());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "--peak") == 0) return peak_run(argv[2], std::atoll(argv[3]));
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
