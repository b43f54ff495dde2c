#include "bench/support/matmul_bench.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "core/cpu.h"
#include "core/tensor.h"
#include "ops/linear.h"

namespace klein::bench {

using namespace klein::quant;

namespace {

const std::vector<std::pair<int64_t, int64_t>>& model_nk() {
  static const std::vector<std::pair<int64_t, int64_t>> nk = {
      {3072, 3072},  {18432, 3072}, {3072, 9216}, {27648, 3072}, {3072, 12288},  // FLUX.2
      {4096, 2560},  {1024, 2560},  {9728, 2560}, {2560, 9728},                  // Qwen3
  };
  return nk;
}

}  // namespace

std::vector<MatmulShape> matmul_bench_shapes(bool full) {
  if (!full) {
    return {{768, 3072, 3072}, {1536, 18432, 3072}, {4608, 3072, 12288}, {768, 9728, 2560},
            {1, 3072, 3072},   {1, 27648, 3072},    {1, 2560, 9728}};
  }
  // [N, K] outermost, so that each weight matrix is built once for all M.
  std::vector<MatmulShape> out;
  for (auto [N, K] : model_nk())
    for (int64_t M : {1, 768, 1536, 4608}) out.push_back({M, N, K});
  return out;
}

std::vector<float> bench_float_weights(int64_t N, int64_t K, uint32_t seed) {
  // A xorshift generator: the values only have to look like weights, and 85M normal
  // samples would take longer than the benchmark.
  std::vector<float> w(size_t(N * K));
  uint32_t s = seed ? seed : 1;
  for (float& v : w) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    v = (float(s >> 8) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
  }
  return w;
}

BenchWeights::BenchWeights(const float* w, DType type, int64_t N, int64_t K,
                           size_t min_total_bytes, ThreadPool& pool) {
  const Layout layout = preferred_layout(type);
  bytes_ = storage_bytes(type, layout, N, K);
  auto first = std::make_unique<uint8_t[]>(bytes_);
  const int64_t g = 16;  // a multiple of every layout's row granularity
  pool.parallel_for((N + g - 1) / g, [&](int64_t g0, int64_t g1, int) {
    const int64_t r0 = g0 * g, r1 = std::min(N, g1 * g);
    pack(w + r0 * K, r1 - r0, K, type, layout, first.get() + storage_bytes(type, layout, r0, K));
  });
  const size_t copies = std::max<size_t>(1, (min_total_bytes + bytes_ - 1) / bytes_);
  copies_.push_back(std::move(first));
  for (size_t c = 1; c < copies; ++c) {
    copies_.push_back(std::make_unique<uint8_t[]>(bytes_));
    std::memcpy(copies_.back().get(), copies_.front().get(), bytes_);
  }
  for (auto& c : copies_) matrices_.push_back(Matrix{type, layout, N, K, c.get(), bytes_});
}

const Matrix& BenchWeights::next() {
  const Matrix& m = matrices_[next_];
  next_ = (next_ + 1) % matrices_.size();
  return m;
}

double time_per_call(const std::function<void()>& fn, double min_seconds) {
  using clock = std::chrono::steady_clock;
  fn();  // warm-up: page faults, first-touch of buffers
  double best = 1e30;
  for (int run = 0; run < 3; ++run) {
    const auto start = clock::now();
    int64_t calls = 0;
    double elapsed = 0;
    do {
      fn();
      ++calls;
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    } while (elapsed < min_seconds);
    best = std::min(best, elapsed / double(calls));
  }
  return best;
}

double measure_copy_bandwidth(ThreadPool& pool, size_t bytes) {
  auto src = alloc_aligned<uint8_t>(bytes), dst = alloc_aligned<uint8_t>(bytes);
  std::memset(src.get(), 1, bytes);
  std::memset(dst.get(), 2, bytes);
  const int64_t chunks = pool.size();
  const size_t chunk = (bytes / size_t(chunks) + 63) / 64 * 64;
  const double seconds = time_per_call(
      [&] {
        pool.for_each_task(chunks, [&](int64_t c, int) {
          const size_t begin = size_t(c) * chunk, end = std::min(bytes, begin + chunk);
          if (begin < end) std::memcpy(dst.get() + begin, src.get() + begin, end - begin);
        });
      },
      0.2);
  return double(bytes) / seconds / 1e9;
}

SgemmFn openblas_sgemm(int threads) {
  const int n = threads > 0 ? threads : usable_cpus();
  return [n](const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
    openblas_set_num_threads(n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, x, int(K),
                w, int(K), 0.0f, y, int(N));
    openblas_set_num_threads(1);
  };
}

void bench_linear(const float* x, int64_t M, const Matrix& w, float* y, Compute& cx) {
  ops::linear(x, M, w, y, cx);
}

std::vector<MatmulBenchRow> run_matmul_bench(const MatmulBenchOptions& options, int threads) {
  std::vector<std::unique_ptr<Compute>> contexts;  // one per instruction set
  std::map<Isa, Compute*> by_isa;
  const std::vector<MatmulShape> shapes =
      options.shapes.empty() ? matmul_bench_shapes(false) : options.shapes;
  const std::vector<Isa> isas = options.isas.empty() ? std::vector<Isa>{best_isa()} : options.isas;
  for (Isa isa : isas) {
    contexts.push_back(std::make_unique<Compute>(threads, isa));
    by_isa[isa] = contexts.back().get();
  }
  ThreadPool& pool = contexts.front()->pool();
  const bool any_matvec = std::any_of(shapes.begin(), shapes.end(),
                                      [](const MatmulShape& s) { return s.M == 1; });
  const double copy_gbps = any_matvec ? measure_copy_bandwidth(pool, options.matvec_bytes) : 0;

  // Group by [N, K] so that each weight matrix is generated and packed once.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> by_nk;
  for (const MatmulShape& s : shapes) by_nk[{s.N, s.K}].push_back(s.M);
  std::vector<MatmulBenchRow> rows;
  for (const auto& [nk, ms] : by_nk) {
    const int64_t N = nk.first, K = nk.second;  // (clang 14 cannot capture a structured binding)
    const std::vector<float> wf = bench_float_weights(N, K, uint32_t(N * 31 + K));
    std::map<int64_t, double> sgemm_gops;
    for (DType type : options.types) {
      std::unique_ptr<BenchWeights> single, rotating;
      for (int64_t M : ms) {
        std::unique_ptr<BenchWeights>& weights = M == 1 ? rotating : single;
        if (!weights)
          weights = std::make_unique<BenchWeights>(wf.data(), type, N, K,
                                                   M == 1 ? options.matvec_bytes : 0, pool);
        const std::vector<float> x = bench_float_weights(M, K, uint32_t(M + 7));
        std::vector<float> y(size_t(M * N));
        const double ops = 2.0 * double(M) * double(N) * double(K);
        if (options.sgemm && !sgemm_gops.count(M)) {
          const double t = time_per_call(
              [&] { options.sgemm(x.data(), M, wf.data(), N, K, y.data()); }, options.min_seconds);
          sgemm_gops[M] = ops / t / 1e9;
        }
        for (Isa isa : isas) {
          const double t = time_per_call(
              [&] { bench_linear(x.data(), M, weights->next(), y.data(), *by_isa[isa]); },
              options.min_seconds);
          MatmulBenchRow row;
          row.type = type;
          row.isa = isa;
          row.shape = {M, N, K};
          row.seconds = t;
          row.gops = ops / t / 1e9;
          row.sgemm_gops = options.sgemm ? sgemm_gops[M] : 0;
          row.weight_gbps = double(weights->bytes_per_matrix()) / t / 1e9;
          row.copy_gbps = M == 1 ? copy_gbps : 0;
          rows.push_back(row);
        }
      }
    }
  }
  return rows;
}

}  // namespace klein::bench
