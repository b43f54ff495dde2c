#pragma once
// The hot loop of the engine: Y[M, N] = X[M, K] * W[N, K]^T with float32 activations X and a
// weight matrix W in any storage type (F32, BF16, F16, Q8, Q4; formats in quant/blocks.h).
// ops::linear is the one entry point of the engine's projections and decides the path:
//
// How each type is multiplied (chosen by measurement, see docs/SPEED.md):
// - F32, BF16, F16 (row-major, straight from safetensors): exact float32 activations, through
//   OpenBLAS sgemm on converted panels (in ops::linear; our own float32 FMA panels reached
//   only 0.85-1.03x sgemm and were removed). Here only on AMX CPUs from 32 rows on: BF16 with
//   each activation split into three bf16 parts (hi + mid + lo = x, exactly), all three
//   multiplied by the bf16 weight on the tile unit into float32 sums (2.2-2.5x sgemm), and
//   any float type rounded to bf16 under float_on_tiles.
// - Q8, Q4: the activations are quantized once per call to int8 in blocks of 32 (scale =
//   max|x| / 127, shared by all threads), then integer blocks are multiplied (AVX-512 VNNI
//   vpdpbusd, NEON sdot, AVX2 pmaddubsw) and each block's int32 sum is scaled into a float
//   accumulator. This adds the activation rounding error (bound below) to the weight
//   quantization error, as int8 engines do, and runs 2x-4x faster than float FMA.
//
// Accuracy against y_exact = sum_k x[m, k] * w[n, k] in exact arithmetic, w the dequantized
// weights, P = sum_k |x[m, k] * w[n, k]|; checked for every output by tests/quant:
// - BF16 on AMX tiles (three parts): (3 K + 20) 2^-24 * 1.01 P (three additions per product;
//   parts below 2^-126 are flushed, which adds 2^-126 sum |w| at most).
// - Q8 / Q4: |y - y_exact| <= sum_b (max_b |x| / 254) sum_{k in b} |w[n, k]|   (int8 rounding)
//                           + (K/32 + 4) 2^-23 sum_b 1.01 max_b |x| S_b + 2^-23 P (float32)
//   over the 32-column blocks b of row m, with S_b = sum_{k in b} |w[n, k]| for Q8 and
//   992 d_b (d_b the block's scale) for Q4. Measured RMS error / RMS y: 5.4e-3 for Gaussian
//   activations, 1.2e-2 when every 97th channel is 30x larger (outliers widen their blocks).
//   For comparison, the weights' own error: Q8 5e-3, Q4 7e-2 (RMS, Gaussian weights).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/threadpool.h"

namespace klein::quant {

enum class Layout : uint8_t {
  RowMajor,       // plain [N, K]; quantized types: K/32 blocks per row (BlockQ8 / BlockQ4)
  Interleaved16,  // Q8/Q4 only: groups of 16 rows, one TileQ8 / TileQ4 per 32 columns
};
std::string_view layout_name(Layout layout);

// Rows a slice must start at (and end at, unless it ends at the last row): 1 for RowMajor,
// 16 for Interleaved16.
int64_t row_granularity(Layout layout);

// A weight matrix W[rows = N, cols = K] held elsewhere (usually a mapped file).
struct Matrix {
  DType type = DType::F32;
  Layout layout = Layout::RowMajor;
  int64_t rows = 0, cols = 0;
  const void* data = nullptr;
  size_t nbytes = 0;

  // Rows [begin, end) as a matrix of its own. begin must be a multiple of
  // row_granularity(layout); so must end, unless end == rows.
  Matrix slice_rows(int64_t begin, int64_t end) const;
};

size_t storage_bytes(DType type, Layout layout, int64_t rows, int64_t cols);

// Quantizes / converts float32 rows w[rows, cols] into `type` / `layout` at `out`
// (storage_bytes(...) bytes). Deterministic: the same input gives the same bytes on any
// machine. Rows may be packed in pieces: pack rows [r0, r1) with r0 a multiple of
// row_granularity(layout) into out + storage_bytes(type, layout, r0, cols).
void pack(const float* w, int64_t rows, int64_t cols, DType type, Layout layout, void* out);

// Blocks already quantized, row-major (rows x cols/32 blocks of a quantized `type`), dealt
// into `layout` at `out` as they are: no value is requantized. Same slicing as pack().
void pack_blocks(const void* blocks, int64_t rows, int64_t cols, DType type, Layout layout, void* out);

// Reference dequantization of rows [r0, r1) into out[(r1 - r0) * cols].
void unpack_rows(const Matrix& w, int64_t r0, int64_t r1, float* out);

// Which instruction set runs the kernels. Auto is the best one the CPU has (within KLEIN_ISA);
// the others force a path, for tests and benchmarks, and fail if it is not available.
// Amx: the AVX-512 kernels, plus AMX BF16 tiles for Q8 / Q4 / BF16 weights from 32 rows of X on.
enum class Isa : uint8_t { Auto, Scalar, Avx2, Avx512, Amx, Neon };
std::string_view isa_name(Isa isa);
bool isa_available(Isa isa);  // compiled in and supported by this CPU (within KLEIN_ISA)
Isa best_isa();
std::vector<Isa> available_isas();  // Scalar first, best last

// Reusable buffers for matmul (the quantized activations). Optional: without one, each call
// allocates its own. Keep one per engine context to avoid page faults on every call.
class MatmulScratch {
 public:
  MatmulScratch();
  ~MatmulScratch();
  MatmulScratch(const MatmulScratch&) = delete;
  MatmulScratch& operator=(const MatmulScratch&) = delete;
  void* get(size_t bytes);  // 64-byte aligned, valid until the next get()
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t capacity_ = 0;
};

struct MatmulOptions {
  Isa isa = Isa::Auto;
  MatmulScratch* scratch = nullptr;
  // F32 / BF16 / F16: on AMX CPUs (Isa::Amx) from 32 rows of X on, multiply on bf16 tiles as
  // the Q8 / Q4 path does (activations and weights rounded to bf16, float32 sums; the bound is
  // (2^-8 + 2^-17 + (K + 20) 2^-24) sum |x w|). Off (the default): BF16 on AMX as three exact
  // bf16 parts; F32 and F16 are not taken (ops::linear multiplies them with OpenBLAS).
  bool float_on_tiles = false;
  // AMX, K above 3072 with activations rounded to bf16: up to this many bytes, X is converted
  // to bf16 once for all the threads' column panels (about 10 % faster on the MLP's down
  // projections); above it, each panel converts each 32-row block of X again. Tests set 0 to
  // take the second path.
  size_t amx_shared_x_bytes = size_t(32) << 20;
};

// Whether matmul(x with M rows, w, options) runs on AMX tiles: Isa::Amx (or Auto on an AMX
// CPU), M >= 32, K a multiple of 32, and weights Q8 / Q4, BF16, or any float type with
// float_on_tiles. ops::linear asks this first for float weights (OpenBLAS otherwise).
bool runs_on_tiles(const Matrix& w, int64_t M, const MatmulOptions& options = {});

// y[m * ldy + n] = sum_k x[m * ldx + k] * W[n, k] for m < M, n < N = w.rows, k < K = w.cols.
// Q8 / Q4 weights on any CPU; float weights only where runs_on_tiles says so (else it throws).
// All paths agree with matmul_reference within the bounds stated at the top of this file.
void matmul(const float* x, int64_t M, int64_t ldx, const Matrix& w, float* y, int64_t ldy,
            ThreadPool& pool, const MatmulOptions& options = {});

// The scalar reference: float32 activations times unpack_rows(w), accumulated in double.
// Slow; for tests and error reports.
void matmul_reference(const float* x, int64_t M, int64_t ldx, const Matrix& w, float* y,
                      int64_t ldy);

// What the converter should write for the fastest kernels on any CPU: Interleaved16 for Q8
// and Q4, RowMajor for the float types (their kernels convert panels on the fly at no
// measurable cost, so the original safetensors run as fast as a converted file).
Layout preferred_layout(DType type);

}  // namespace klein::quant
