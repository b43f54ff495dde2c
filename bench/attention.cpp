// ops::attention on the FLUX.2 transformer's shapes: 24 heads of 128, no mask, S = 512 text
// tokens + (W / 16)·(H / 16) image tokens: 768 (256x256), 1280 (512x512), 4608 (1024x1024).
//
//   build/bench/bench_attention [--benchmark_filter=<regex>] [--benchmark_repetitions=3]
//
// Names: attention/<path>/S:<S> with path
//   legacy  the previous implementation (64 x 256 sgemm tiles, libm expf), kept here so that
//           old and new are compared in the same run on a busy machine;
//   exact   the default float32 path;
//   bf16    Arithmetic::bf16_attention (AMX tiles; VDPBF16PS on AMD's AVX-512 BF16 CPUs
//           without AMX; the exact path elsewhere, see the label);
//   bf16-vector  the VDPBF16PS kernel on any AVX-512 BF16 CPU (attention_bf16_vector).
// GFLOP/s counts 4·S²·heads·head_dim per call (Q·Kᵀ and P·V). Threads: KLEIN_THREADS
// (default 2).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "ops/compute.h"
#include "ops/attention.h"
#include "ops/blas.h"
#include "ops/gemm.h"

namespace {

using namespace klein;

constexpr int64_t kHeads = 24, kHeadDim = 128;

Compute& cx() {
  static Compute p([] {
    const char* t = std::getenv("KLEIN_THREADS");
    return t ? std::atoi(t) : 2;
  }());
  return p;
}

struct Inputs {
  std::vector<float> q, k, v, out;
};

const Inputs& inputs(int64_t S) {
  static int64_t cached = -1;
  static Inputs in;
  if (cached != S) {
    std::mt19937 rng{uint32_t(S)};
    std::normal_distribution<float> d(0.f, 1.f);
    const size_t n = size_t(S * kHeads * kHeadDim);
    for (auto* x : {&in.q, &in.k, &in.v}) {
      x->resize(n);
      for (auto& e : *x) e = d(rng);
    }
    in.out.assign(n, 0.f);
    cached = S;
  }
  return in;
}

// The implementation before the vectorised softmax and the bf16 path, unmasked case only.
void legacy_attention(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v,
                      int64_t ldv, float* out, int64_t ldo, const ops::AttentionParams& p,
                      ThreadPool& pool) {
  constexpr int64_t kQueryTile = 64, kKeyTile = 256;
  const int64_t D = p.head_dim;
  const int64_t q_tiles = (p.q_len + kQueryTile - 1) / kQueryTile;
  ops::ensure_blas_single_threaded();
  pool.for_each_task(p.heads * q_tiles, [&](int64_t t, int) {
    thread_local std::vector<float> scores, acc, row_max, row_sum;
    scores.resize(size_t(kQueryTile * kKeyTile));
    acc.assign(size_t(kQueryTile * D), 0.f);
    row_max.assign(size_t(kQueryTile), -std::numeric_limits<float>::infinity());
    row_sum.assign(size_t(kQueryTile), 0.f);
    const int64_t head = t / q_tiles, q0 = (t % q_tiles) * kQueryTile;
    const int64_t rows = std::min(kQueryTile, p.q_len - q0);
    const float* qh = q + q0 * ldq + head * D;
    for (int64_t k0 = 0; k0 < p.kv_len; k0 += kKeyTile) {
      const int64_t cols = std::min(kKeyTile, p.kv_len - k0);
      float* S = scores.data();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(cols), int(D), p.scale,
                  qh, int(ldq), k + head * D + k0 * ldk, int(ldk), 0.0f, S, int(kKeyTile));
      for (int64_t i = 0; i < rows; ++i) {
        float* srow = S + i * kKeyTile;
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < cols; ++j) tile_max = std::max(tile_max, srow[j]);
        const float new_max = std::max(row_max[size_t(i)], tile_max);
        const float correction = std::exp(row_max[size_t(i)] - new_max);
        float sum = 0;
        for (int64_t j = 0; j < cols; ++j) {
          srow[j] = std::exp(srow[j] - new_max);
          sum += srow[j];
        }
        row_sum[size_t(i)] = row_sum[size_t(i)] * correction + sum;
        row_max[size_t(i)] = new_max;
        if (correction != 1.0f)
          for (int64_t d = 0; d < D; ++d) acc[size_t(i * D + d)] *= correction;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(D), int(cols), 1.0f, S,
                  int(kKeyTile), v + head * D + k0 * ldv, int(ldv), 1.0f, acc.data(), int(D));
    }
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t d = 0; d < D; ++d)
        out[(q0 + i) * ldo + head * D + d] = acc[size_t(i * D + d)] / row_sum[size_t(i)];
  });
}

enum class Path { Legacy, Exact, Bf16, Bf16Vector };

void BM_attention(benchmark::State& state, Path path) {
  const int64_t S = state.range(0), W = kHeads * kHeadDim;
  auto& in = const_cast<Inputs&>(inputs(S));
  ops::AttentionParams p;
  p.q_len = p.kv_len = S;
  p.heads = p.kv_heads = kHeads;
  p.head_dim = kHeadDim;
  p.scale = float(1.0 / std::sqrt(double(kHeadDim)));
  cx().arithmetic.bf16_attention = path == Path::Bf16;
  for (auto _ : state) {
    if (path == Path::Legacy)
      legacy_attention(in.q.data(), W, in.k.data(), W, in.v.data(), W, in.out.data(), W, p, cx().pool());
    else if (path == Path::Bf16Vector)
      ops::attention_bf16_vector(in.q.data(), W, in.k.data(), W, in.v.data(), W, in.out.data(), W,
                                 p, cx());
    else
      ops::attention(in.q.data(), W, in.k.data(), W, in.v.data(), W, in.out.data(), W, p, cx());
    benchmark::DoNotOptimize(in.out.data());
  }
  const double flops = 4.0 * double(S) * double(S) * double(kHeads) * double(kHeadDim);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = cx().threads();
  if (path == Path::Bf16)
    state.SetLabel(!ops::uses_bf16_attention(p, cx()) ? "exact path (no bf16 kernel here)"
                   : cx().amx()                        ? "amx tiles"
                                                       : "vdpbf16ps");
}

void sizes(benchmark::internal::Benchmark* b) {
  for (int64_t S : {768, 1280, 4608}) b->Arg(S);
  b->ArgName("S")->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_attention, legacy, Path::Legacy)->Name("attention/legacy")->Apply(sizes);
BENCHMARK_CAPTURE(BM_attention, exact, Path::Exact)->Name("attention/exact")->Apply(sizes);
BENCHMARK_CAPTURE(BM_attention, bf16, Path::Bf16)->Name("attention/bf16")->Apply(sizes);
BENCHMARK_CAPTURE(BM_attention, bf16_vector, Path::Bf16Vector)
    ->Name("attention/bf16-vector")
    ->Apply(sizes);

// One thread, the products of the generation path: ours (ops::gemm) against OpenBLAS's
// sgemm on the same operands. Shapes: attention's Q·Kᵀ of a 256-query tile against 1024
// keys and P·V (rows of Q, K, V 24·128 floats apart, as in the transformer), a float
// projection panel (1024 tokens x 64 rows of W, K 3072), a VAE convolution tile (512
// channels, 512 pixels, K = 512·9).
struct GemmShape {
  const char* name;
  int64_t M, N, K, lda, ldb;
  bool b_transposed;
};
const GemmShape kGemmShapes[] = {{"qk", 256, 1024, 128, kHeads * kHeadDim, kHeads * kHeadDim, true},
                                 {"pv", 256, 128, 1024, 1024, kHeads * kHeadDim, false},
                                 {"linear", 1024, 64, 3072, 3072, 3072, true},
                                 {"conv", 512, 512, 4608, 4608, 512, false}};

void BM_gemm(benchmark::State& state, bool ours) {
  const GemmShape& s = kGemmShapes[state.range(0)];
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> a(size_t(s.M * s.lda)), b(size_t((s.b_transposed ? s.N : s.K) * s.ldb)),
      c(size_t(s.M * s.N)), pack(ops::gemm_pack_floats());
  for (auto* v : {&a, &b})
    for (float& x : *v) x = d(rng);
  ops::ensure_blas_single_threaded();
  const quant::Isa isa = quant::best_isa() == quant::Isa::Amx ? quant::Isa::Avx512 : quant::best_isa();
  for (auto _ : state) {
    if (ours)
      ops::gemm({.M = s.M, .N = s.N, .K = s.K, .a = a.data(), .lda = s.lda, .b = b.data(),
                 .ldb = s.ldb, .b_transposed = s.b_transposed, .c = c.data(), .ldc = s.N},
                isa, pack.data());
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, s.b_transposed ? CblasTrans : CblasNoTrans,
                  int(s.M), int(s.N), int(s.K), 1.0f, a.data(), int(s.lda), b.data(), int(s.ldb),
                  0.0f, c.data(), int(s.N));
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(s.M * s.N * s.K),
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(s.name) + (ours ? " " + std::string(quant::isa_name(isa)) : ""));
}

void gemm_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t i = 0; i < int64_t(std::size(kGemmShapes)); ++i) b->Arg(i);
  b->ArgName("shape")->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_gemm, ours, true)->Name("gemm/ours")->Apply(gemm_shapes);
BENCHMARK_CAPTURE(BM_gemm, openblas, false)->Name("gemm/openblas")->Apply(gemm_shapes);

}  // namespace

BENCHMARK_MAIN();
