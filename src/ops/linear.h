#pragma once
// Linear layers over weights of any storage type: y = x · Wᵀ. The kernels dequantize per
// block inside the inner loop (quant/), never a whole matrix.
#include <cstdint>

#include "core/threadpool.h"
#include "quant/matmul.h"
#include "weights/weight_store.h"

namespace klein::ops {

// y[m, n] = Σ_k x[m, k] · W[n, k] for a weight W of shape [N, K] (PyTorch Linear layout).
// x rows are `ldx` floats apart, y rows `ldy` apart (so a linear can write into a column
// range of a wider buffer).
void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
            ThreadPool& pool);
// Dense shorthand: ldx = K = w.cols(), ldy = N = w.rows().
void linear(const float* x, int64_t M, const Weight& w, float* y, ThreadPool& pool);

// While an instance lives, linear() calls made on this thread multiply float weights (F32,
// BF16, F16) on bf16 tiles where the CPU has AMX (quant::MatmulOptions::float_on_tiles), from
// 32 rows of x on: activations and weights rounded to bf16, float32 sums, several times
// faster than float32. An autocast region: the pipeline opens one for --precision fast.
// Quantized weights are unaffected (they use their own kernels either way).
class FloatWeightsOnTiles {
 public:
  explicit FloatWeightsOnTiles(bool on = true);
  ~FloatWeightsOnTiles();
  FloatWeightsOnTiles(const FloatWeightsOnTiles&) = delete;
  FloatWeightsOnTiles& operator=(const FloatWeightsOnTiles&) = delete;

 private:
  bool previous_;
};

// The weight as the matmul kernels see it (quant::Matrix: type, layout, rows x cols, bytes).
quant::Matrix as_matrix(const Weight& w);

// Rows [begin, end) of a weight, as a view (for fused projections such as Q|K|V|gate|up).
Weight weight_rows(const Weight& w, int64_t begin, int64_t end);

// y[m, :] += bias for every row.
void add_bias(float* y, int64_t M, int64_t N, int64_t ldy, const float* bias);

}  // namespace klein::ops
