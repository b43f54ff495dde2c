// VAE speed and memory at klein's real shapes (channels [128, 256, 512, 512]) with random BF16
// weights (tests/vae/random_store.h); the numbers do not depend on the weight values.
//
//   bench_vae [--benchmark_filter=<regex>]   Google Benchmark: decode, encode, single convs
//   bench_vae --peak decode 1024             one 1024x1024 decode: time per stage, peak RSS
//   bench_vae --peak decode 2048 banded      ... as the default plans it ("default"), or forced
//                                            whole-image ("whole") or banded ("banded",
//                                            "banded-memory": no scratch files); a
//                                            banded run prints no per-stage times (reporting an
//                                            intermediate builds the whole tensor)
//   bench_vae --peak encode 1024 [plan]      the same for an encode
//   bench_vae --peak decode-fast 1024        ... with the fast convolutions (AMX tiles, else the
//                                            AVX-512 BF16 direct kernel where VDPBF16PS is
//                                            fast, else Winograd; "-bf16" is the same)
//   bench_vae --compare [sides...]           exact and fast decodes (arithmetic
//                                            fast_convolutions) taking turns, default 256, 512:
//                                            times, GFLOP/s, speedup and image difference
//
// GFLOP/s counts the decoder's convolutions only (2 x multiply-adds; 618 GFLOP at 256x256),
// not the attention or the norms.
//
// Threads: KLEIN_THREADS (default: all cores).
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
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

Compute& cx() {
  static Compute p(thread_count());
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

// Multiply-adds x 2 of the decoder's convolutions for an image of height x width, following
// decoder.cpp.
double decoder_conv_flops(const VaeConfig& c, int64_t height, int64_t width) {
  const std::vector<int64_t>& channels = c.decoder_channels();
  const int64_t levels = int64_t(channels.size()), down = int64_t(1) << (levels - 1);
  double pixels = double(height / down) * double(width / down);
  auto conv = [&](int64_t in, int64_t out, int64_t k) {
    return 2.0 * double(in * out * k * k) * pixels;
  };
  auto resnet = [&](int64_t in, int64_t out) {
    return conv(in, out, 3) + conv(out, out, 3) + (in != out ? conv(in, out, 1) : 0.0);
  };
  const int64_t top = channels.back();
  double flops = c.use_post_quant_conv ? conv(c.latent_channels, c.latent_channels, 1) : 0.0;
  flops += conv(c.latent_channels, top, 3) + 2 * resnet(top, top);
  int64_t in = top;
  for (int64_t i = 0; i < levels; ++i) {
    const int64_t out = channels[size_t(levels - 1 - i)];
    for (int64_t j = 0; j <= c.layers_per_block; ++j, in = out) flops += resnet(in, out);
    if (i + 1 < levels) {
      pixels *= 4;
      flops += conv(out, out, 3);
    }
  }
  return flops + conv(channels.front(), c.out_channels, 3);
}

bool bf16_convolutions_available() { return ops::conv2d_bf16_auto_available(); }

// args = side, fast (0 exact float32, 1 arithmetic.fast_convolutions: bf16 or Winograd).
void BM_Decode(benchmark::State& state) {
  const int64_t side = state.range(0);
  cx().arithmetic.fast_convolutions = state.range(1) != 0;
  vae::Vae model(store(), cx());
  const Tensor tokens = random_tensor({(side / 16) * (side / 16), 128});
  for (auto _ : state) benchmark::DoNotOptimize(model.decode(tokens, side / 16, side / 16));
  state.counters["peak_rss_MiB"] = peak_rss_mib();
  state.counters["GFLOP/s"] = benchmark::Counter(decoder_conv_flops(model.config(), side, side),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Decode)
    ->ArgsProduct({{256, 512}, {0, 1}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

void BM_Encode(benchmark::State& state) {
  const int64_t side = state.range(0);
  vae::Vae model(store(), cx());
  const Tensor pixels = random_tensor({3, side, side}, 0.5f);
  for (auto _ : state) benchmark::DoNotOptimize(model.encode(pixels));
  state.counters["peak_rss_MiB"] = peak_rss_mib();
}
BENCHMARK(BM_Encode)->Arg(256)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();

// One 3×3 convolution with the fused GroupNorm + SiLU input, as in every ResNet:
// args = channels in, channels out, side, algorithm (0 im2col + GEMM, 1 direct, 2 BF16 tiles,
// 3 BF16 direct, 4 Winograd). GFLOP/s counts the direct form's 9 multiply-adds per output
// value and input channel, also for Winograd (which does 2.25).
void BM_Conv3x3(benchmark::State& state) {
  const int64_t in = state.range(0), out = state.range(1), side = state.range(2);
  ops::Conv2dParams p = ops::Conv2dParams::same(3);
  constexpr ops::ConvAlgorithm kAlgorithms[] = {
      ops::ConvAlgorithm::Gemm, ops::ConvAlgorithm::Direct, ops::ConvAlgorithm::Bf16Tiles,
      ops::ConvAlgorithm::Bf16Direct, ops::ConvAlgorithm::Winograd};
  p.algorithm = kAlgorithms[state.range(3)];
  if (state.range(3) == 1 && !ops::conv2d_direct_available())
    return state.SkipWithError("no direct kernel");
  if (state.range(3) == 2 && !ops::conv2d_bf16_tiles_available())
    return state.SkipWithError("no AMX");
  if (state.range(3) == 3 && !ops::conv2d_bf16_direct_available())
    return state.SkipWithError("no AVX-512 BF16");
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
  for (auto _ : state) benchmark::DoNotOptimize(ops::conv2d(x, w, p, cx(), &norm));
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * double(out * in * 9 * side * side),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Conv3x3)
    ->ArgsProduct({{128}, {128}, {512}, {0, 1, 2, 3, 4}})
    ->ArgsProduct({{256}, {128}, {512}, {0, 1, 2, 3, 4}})
    ->ArgsProduct({{512}, {512}, {128}, {0, 1, 2, 3, 4}})
    ->ArgsProduct({{128}, {3}, {512}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// One full-size run, printing the time spent up to each reported intermediate and the peak
// resident memory (weights included: 84M BF16 parameters = 160 MiB).
int peak_run(std::string what, int64_t side, const std::string& plan) {
  bool bf16 = false;  // the fast convolutions (the suffix -fast, or -bf16 as before)
  for (const std::string suffix : {"-fast", "-bf16"})
    if (what.size() > suffix.size() &&
        what.compare(what.size() - suffix.size(), suffix.size(), suffix) == 0) {
      what.resize(what.size() - suffix.size());
      bf16 = true;
    }
  cx().arithmetic.fast_convolutions = bf16;
  vae::VaeMemory memory;
  if (plan == "whole") memory.whole_limit = SIZE_MAX;
  if (plan == "banded" || plan == "banded-memory") memory.whole_limit = 0;
  if (plan == "banded-memory") memory.plane_limit = SIZE_MAX;  // no scratch files
  if (plan != "default" && plan != "whole" && plan != "banded" && plan != "banded-memory") {
    std::fprintf(stderr, "--peak: plan must be default, whole, banded or banded-memory, got %s\n", plan.c_str());
    return 2;
  }
  const bool banded = what == "decode"
                          ? vae::decode_memory(store().config().vae, side, side, memory).banded
                          : vae::encode_memory(store().config().vae, side, side, memory).banded;
  vae::Vae model(store(), cx(), memory);
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
  std::printf("%s%s %lldx%lld, %d threads, %s convolutions; RSS with weights resident: %.0f MiB\n",
              what.c_str(), banded ? " (banded)" : "", (long long)side, (long long)side,
              cx().threads(),
              bf16 ? (ops::conv2d_bf16_tiles_available() ? "BF16-tile"
                      : ops::conv2d_bf16_auto_available()
                          ? "Winograd float32 (conv_out BF16 direct)"
                      : ops::conv2d_bf16_direct_available()
                          ? "Winograd float32 (VDPBF16PS is slower than FMA on this CPU)"
                          : "Winograd float32 (no BF16 kernel)")
                   : "float32",
              weights_rss);
  if (what == "decode") {
    const Tensor tokens = random_tensor({(side / 16) * (side / 16), 128});
    model.decode(tokens, side / 16, side / 16, banded ? vae::Observer() : timer);
  } else if (what == "encode") {
    const Tensor pixels = random_tensor({3, side, side}, 0.5f);
    model.encode(pixels, banded ? vae::Observer() : timer);
  } else {
    std::fprintf(stderr, "--peak expects decode or encode, got %s\n", what.c_str());
    return 2;
  }
  std::printf("total %.2f s, peak RSS %.0f MiB\n",
              std::chrono::duration<double>(clock::now() - start).count(), peak_rss_mib());
  return 0;
}

// Exact (float32) and fast decodes of the same tokens, taking turns so that both see the same
// machine (it may be busy): `rounds` of each per side, best and median time, GFLOP/s of the
// convolutions (counted in their direct form), the speedup of the medians and how far the fast
// image is from the exact one (max|difference| / max|exact|, and the mean absolute difference).
int compare_run(const std::vector<int64_t>& sides, int rounds) {
  if (!bf16_convolutions_available())
    std::printf("no fast BF16 convolutions on this CPU: the fast ones are Winograd float32\n");
  vae::Vae model(store(), cx());
  std::printf("decode, %d threads, %d rounds each, the two taking turns\n", cx().threads(), rounds);
  std::printf("%6s %-8s %9s %9s %9s %8s %12s %12s\n", "side", "convs", "best s", "median s",
              "GFLOP/s", "speedup", "max diff", "mean |diff|");
  using clock = std::chrono::steady_clock;
  for (const int64_t side : sides) {
    const Tensor tokens = random_tensor({(side / 16) * (side / 16), 128});
    const double flops = decoder_conv_flops(model.config(), side, side);
    std::vector<double> times[2];
    Tensor images[2];
    for (int r = 0; r < rounds; ++r)
      for (int which = 0; which < 2; ++which) {
        const auto start = clock::now();
        cx().arithmetic.fast_convolutions = which == 1;
        images[which] = model.decode(tokens, side / 16, side / 16);
        times[which].push_back(std::chrono::duration<double>(clock::now() - start).count());
      }
    double max_diff = 0, max_ref = 0, sum_diff = 0;
    for (int64_t i = 0; i < images[0].numel(); ++i) {
      const double d = std::fabs(double(images[1].data()[i]) - images[0].data()[i]);
      max_diff = std::max(max_diff, d);
      sum_diff += d;
      max_ref = std::max(max_ref, std::fabs(double(images[0].data()[i])));
    }
    double medians[2];
    for (int which = 0; which < 2; ++which) {
      std::vector<double>& t = times[which];
      std::sort(t.begin(), t.end());
      const size_t n = t.size();
      medians[which] = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    }
    std::printf("%6lld %-8s %9.2f %9.2f %9.1f\n", (long long)side, "exact", times[0].front(),
                medians[0], flops * 1e-9 / medians[0]);
    std::printf("%6lld %-8s %9.2f %9.2f %9.1f %7.2fx %12.2e %12.2e\n", (long long)side, "fast",
                times[1].front(), medians[1], flops * 1e-9 / medians[1], medians[0] / medians[1],
                max_diff / max_ref, sum_diff / double(images[0].numel()));
    std::printf("%6lld conv work %.0f GFLOP\n", (long long)side, flops * 1e-9);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::strcmp(argv[1], "--peak") == 0)
    return peak_run(argv[2], std::atoll(argv[3]), argc >= 5 ? argv[4] : "default");
  if (argc >= 2 && std::strcmp(argv[1], "--compare") == 0) {
    std::vector<int64_t> sides;
    for (int i = 2; i < argc; ++i) sides.push_back(std::atoll(argv[i]));
    if (sides.empty()) sides = {256, 512};
    const char* rounds = std::getenv("KLEIN_ROUNDS");
    return compare_run(sides, rounds ? std::max(1, std::atoi(rounds)) : 3);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
