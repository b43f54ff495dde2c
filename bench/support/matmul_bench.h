#pragma once
// The matmul benchmark, for `klein bench matmul` and bench/matmul.cpp: the shapes of the
// model's linear layers, weights in every type through ops::linear (the path the engine
// takes: OpenBLAS or AMX tiles for float weights, the quant kernels for Q8 / Q4), throughput
// against float32 sgemm and, for M = 1, weight bandwidth against memcpy bandwidth.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/threadpool.h"
#include "ops/compute.h"
#include "quant/matmul.h"

namespace klein::bench {

using quant::Isa;
using quant::Matrix;

struct MatmulShape {
  int64_t M, N, K;
};

// FLUX.2-klein 4B transformer ([N, K] = qkv/out/MLP projections of the double and single
// blocks) and Qwen3-4B ([4096, 2560] q, [1024, 2560] k/v, [9728, 2560] gate/up,
// [2560, 9728] down), at M = 768, 1536, 4608 tokens, plus M = 1 for each [N, K].
// `full` = false gives a representative subset that runs in about a minute.
std::vector<MatmulShape> matmul_bench_shapes(bool full);

// An external float32 GEMM to compare against: y[M, N] = x[M, K] * w[N, K]^T (row-major, no
// strides), e.g. OpenBLAS cblas_sgemm.
using SgemmFn = std::function<void(const float* x, int64_t M, const float* w, int64_t N,
                                   int64_t K, float* y)>;

struct MatmulBenchOptions {
  std::vector<DType> types{DType::F32, DType::BF16, DType::F16, DType::Q8, DType::Q4};
  std::vector<Isa> isas;             // empty: best_isa() only
  std::vector<MatmulShape> shapes;   // empty: matmul_bench_shapes(false)
  double min_seconds = 0.3;          // per measurement; the best of 3 such runs is kept
  SgemmFn sgemm;                     // optional
  // M = 1 rotates through copies of the weights adding up to this, so they come from memory.
  size_t matvec_bytes = size_t(1) << 30;
};

struct MatmulBenchRow {
  DType type;
  Isa isa;
  MatmulShape shape;
  double seconds;      // per call, best of the repeats
  double gops;         // 2 M N K / seconds / 1e9
  double sgemm_gops;   // the same shape with `sgemm` on float32 weights; 0 if not measured
  double weight_gbps;  // bytes of W read per second / 1e9 (meaningful for M = 1)
  double copy_gbps;    // memcpy bandwidth measured in the same run (M = 1 rows only)
};

// Runs every shape and type on `threads` worker threads (0: the usable CPUs), one compute
// context per instruction set.
std::vector<MatmulBenchRow> run_matmul_bench(const MatmulBenchOptions& options, int threads);

// OpenBLAS cblas_sgemm on `threads` threads (0: the usable CPUs). The engine's linear layers
// keep OpenBLAS single-threaded (they call it from their own workers), so this sets the
// thread count around each call and puts it back to one.
SgemmFn openblas_sgemm(int threads);

// One product through the engine's linear layer, as the models call it.
void bench_linear(const float* x, int64_t M, const Matrix& w, float* y, Compute& cx);

// Building blocks shared with bench/matmul.cpp.

// Random weights [N, K] of one type in its preferred layout. For small M the matrix is
// replicated until the copies exceed `min_total_bytes`, and next() rotates through them, so
// that a matrix-vector product reads its weights from memory rather than from the cache.
class BenchWeights {
 public:
  // w: float32 weights [N, K] to pack (in parallel on the pool).
  BenchWeights(const float* w, DType type, int64_t N, int64_t K, size_t min_total_bytes,
               ThreadPool& pool);
  const Matrix& next();
  size_t bytes_per_matrix() const { return bytes_; }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> copies_;
  std::vector<Matrix> matrices_;
  size_t bytes_ = 0, next_ = 0;
};

// Random float32 weights [N, K] with the spread of trained ones (uniform, +-0.05).
std::vector<float> bench_float_weights(int64_t N, int64_t K, uint32_t seed);

// Bytes copied per second by memcpy over `bytes` (split across the pool's threads), best of 3.
double measure_copy_bandwidth(ThreadPool& pool, size_t bytes);

// Seconds per call of fn: runs it until min_seconds have passed, three times; the best run.
double time_per_call(const std::function<void()>& fn, double min_seconds);

}  // namespace klein::bench
