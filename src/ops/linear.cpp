#include "ops/linear.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "ops/gemm.h"
#include "quant/types.h"
#include "quant/kernels.h"
#include "quant/matmul.h"

namespace klein::ops {

static_assert(kSamePathRows == quant::detail::kAmxMinRows,
              "the row count from which the kernels' path is fixed");

namespace {

// Rows of W converted to float32 per task: enough to keep gemm efficient, small enough to
// stay in L2 (64 rows x 3072 x 4 B = 768 KiB at the widest common K).
constexpr int64_t kPanelRows = 64;

void linear_float_rows(const float* x, int64_t M, int64_t ldx, const quant::Matrix& w, float* y,
                       int64_t ldy, Compute& cx) {
  const int64_t N = w.rows, K = w.cols;
  const size_t elem = dtype_size(w.type);
  const auto* base = static_cast<const std::byte*>(w.data);
  const int64_t panels = (N + kPanelRows - 1) / kPanelRows;
  cx.pool().for_each_task(panels, [&](int64_t p, int worker) {
    const int64_t n0 = p * kPanelRows, rows = std::min(kPanelRows, N - n0);
    const float* panel;
    Arena::Scope scratch(cx.arena(worker));
    if (w.type == DType::F32) {
      panel = reinterpret_cast<const float*>(base) + n0 * K;
    } else {
      float* converted = scratch.take<float>(size_t(rows * K));
      to_f32(w.type, base + size_t(n0 * K) * elem, converted, size_t(rows * K));
      panel = converted;
    }
    // y[:, n0 : n0 + rows] = x · panelᵀ
    gemm({.M = M, .N = rows, .K = K, .a = x, .lda = ldx, .b = panel, .ldb = K,
          .b_transposed = true, .c = y + n0, .ldc = ldy},
         cx.isa(), scratch.take<float>(gemm_pack_floats()));
  });
}

}  // namespace

void linear(const float* x, int64_t M, int64_t ldx, const quant::Matrix& w, float* y,
            int64_t ldy, Compute& cx) {
  if (M == 0) return;
  const quant::MatmulOptions options = cx.matmul_options();
  if (dtype_is_float(w.type) && w.layout == quant::Layout::RowMajor) {
    // On AMX CPUs quant multiplies BF16 weights exactly on tiles (activations in three bf16
    // parts), and any float weight rounded to bf16 when the context's arithmetic says
    // float_on_tiles. Elsewhere our float32 gemm on converted panels.
    if (quant::runs_on_tiles(w, M, options))
      return quant::matmul(x, M, ldx, w, y, ldy, cx.pool(), options);
    return linear_float_rows(x, M, ldx, w, y, ldy, cx);
  }
  // Quantized weights: the kernels multiply block by block (quant/matmul.h).
  quant::matmul(x, M, ldx, w, y, ldy, cx.pool(), options);
}

void linear(const float* x, int64_t M, int64_t ldx, const Weight& w, float* y, int64_t ldy,
            Compute& cx) {
  if (w.shape.size() != 2)
    fail("tensor ", w.name, ": expected a 2-D weight for a linear layer, got ", shape_str(w.shape));
  if (!quant::is_storage_type(w.dtype))
    fail("tensor ", w.name, ": storage type ", dtype_name(w.dtype), " is not supported by linear");
  linear(x, M, ldx, as_matrix(w), y, ldy, cx);
}

quant::Matrix as_matrix(const Weight& w) {
  quant::Matrix m;
  m.type = w.dtype;
  m.layout = static_cast<quant::Layout>(w.layout);
  m.rows = w.rows();
  m.cols = w.cols();
  m.data = w.data;
  m.nbytes = w.nbytes;
  return m;
}

void linear(const float* x, int64_t M, const Weight& w, float* y, Compute& cx) {
  linear(x, M, w.cols(), w, y, w.rows(), cx);
}

void linear(const float* x, int64_t M, const quant::Matrix& w, float* y, Compute& cx) {
  linear(x, M, w.cols, w, y, w.rows, cx);
}

quant::Matrix weight_rows(const Weight& w, int64_t begin, int64_t end) {
  if (!(begin >= 0 && begin <= end && end <= w.rows()))
    fail("tensor ", w.name, ": row range [", begin, ", ", end, ") outside ", w.rows(), " rows");
  const quant::Matrix m = as_matrix(w);
  // Packed layouts slice at their row granularity (quant::row_granularity).
  const int64_t g = quant::row_granularity(m.layout);
  if (begin % g != 0 || (end % g != 0 && end != w.rows()))
    fail("tensor ", w.name, ": rows [", begin, ", ", end, ") do not fall on the ", g,
         "-row groups of its ", quant::layout_name(m.layout), " layout");
  return m.slice_rows(begin, end);
}

void add_bias(float* y, int64_t M, int64_t N, int64_t ldy, const float* bias) {
  for (int64_t m = 0; m < M; ++m) {
    float* row = y + m * ldy;
    for (int64_t n = 0; n < N; ++n) row[n] += bias[n];
  }
}

}  // namespace klein::ops
