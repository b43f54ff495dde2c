#pragma once
// Linear layers over weights of any storage type: y = x · Wᵀ. The kernels dequantize per
// block inside the inner loop (quant/), never a whole matrix.
#include <cstdint>

#include "ops/compute.h"
#include "quant/matmul.h"
#include "core/weight.h"

namespace klein::ops {

// y[m, n] = Σ_k x[m, k] · W[n, k] for a weight W of shape [N, K] (PyTorch Linear layout).
// x rows are `ldx` floats apart, y rows `ldy` apart (so a linear can write into a column
// range of a wider buffer).
void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
            Compute& cx);
// Dense shorthand: ldx = K = w.cols(), ldy = N = w.rows().
void linear(const float* x, int64_t M, const Weight& w, float* y, Compute& cx);
// The same on a matrix view (e.g. weight_rows of a fused projection).
void linear(const float* x, int64_t M, int64_t ldx, const quant::Matrix& w, float* y,
            int64_t ldy, Compute& cx);
void linear(const float* x, int64_t M, const quant::Matrix& w, float* y, Compute& cx);

// The fewest rows from which a product's kernel path does not depend on the row count (AMX
// tiles take 32 rows or more; no other path looks at the count): a product over at least this
// many rows gives each row the same bits as any other product of at least this many rows
// that holds it, on any CPU. A batch stacks the rows of several images where each image's
// rows reach this, and keeps products at least this long.
inline constexpr int64_t kSamePathRows = 32;

// The weight as the matmul kernels see it (quant::Matrix: type, layout, rows x cols, bytes).
quant::Matrix as_matrix(const Weight& w);

// Rows [begin, end) of a weight, as a matrix view (for fused projections such as
// Q|K|V|gate|up); packed layouts slice at their row groups.
quant::Matrix weight_rows(const Weight& w, int64_t begin, int64_t end);

// y[m, :] += bias for every row.
void add_bias(float* y, int64_t M, int64_t N, int64_t ldy, const float* bias);

}  // namespace klein::ops
