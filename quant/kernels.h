#pragma once
// Internal to klein_quant: the table of kernels each instruction set provides, and the int8
// activation format they share. quant/matmul.cpp does the tiling and threading and calls
// these on cache-sized pieces; the kernels never allocate and never spawn work.
#include <cstdint>

#include "core/dtype.h"
#include "quant/blocks.h"
#include "quant/matmul.h"

namespace klein::quant::detail {

// Activations quantized per row in blocks of 32 columns: x[m, k] ~= scale * q. Every
// instruction set produces bit-identical values (quantize_rows in kernels_scalar.cpp is the
// definition): scale = max|x| / 127, q = round_even(x * (127 / max|x|)).
// Rows are stored in tiles of `tile_rows` (the kernel's int_rows), block by block, so that a
// kernel reads one contiguous stream with constant offsets: block b of row m is entry
//   e = (m / tile_rows * blocks_per_row + b) * tile_rows + m % tile_rows,
// its 32 values at q + 32 e and its numbers at scale[e], scaled_sum[e], neg128_sum[e].
// (Rows of a tile also never sit 4 KiB apart, which made 12 row streams fight over one L1 set.)
struct ActBlocks {
  int8_t* q = nullptr;
  float* scale = nullptr;         // d = max|x| / 127
  float* scaled_sum = nullptr;    // d * (sum of the block's q): the Q4 zero-point term
  int32_t* neg128_sum = nullptr;  // -128 * (sum of the block's q): undoes the Q8 tile bias
  int64_t blocks_per_row = 0;
  int tile_rows = 1;

  int64_t entry(int64_t m, int64_t b) const {
    return (m / tile_rows * blocks_per_row + b) * tile_rows + m % tile_rows;
  }
};

// Quantizes rows [m0, m1) of x (row m at x + m * ldx, K columns) into act.
using QuantizeRowsFn = void (*)(const float* x, int64_t ldx, int64_t m0, int64_t m1, int64_t K,
                                const ActBlocks& act);

// y[r, c] (+)= sum over nblocks tiles of activation row m0 + r times tile row c, for
// r < rows <= int_rows and c < cols <= 16, starting at block b0 of the activations. m0 is a
// multiple of act.tile_rows; `tiles` are consecutive tiles of one 16-row group; `accumulate`
// adds to y instead of overwriting it (for K split into chunks).
using TilesQ8Fn = void (*)(const ActBlocks& act, int64_t m0, int64_t b0, int rows,
                           const TileQ8* tiles, int64_t nblocks, float* y, int64_t ldy, int cols,
                           bool accumulate);
using TilesQ4Fn = void (*)(const ActBlocks& act, int64_t m0, int64_t b0, int rows,
                           const TileQ4* tiles, int64_t nblocks, float* y, int64_t ldy, int cols,
                           bool accumulate);

// Copies rows [0, rows) (rows <= gemm_rows), columns [0, kc) of x into out[kc][gemm_rows],
// interleaved so that the kernel finds x[r, k] at out[k * gemm_rows + r]; missing rows are 0.
using PackRowsFn = void (*)(const float* x, int64_t ldx, int rows, int kc, float* out);

// Converts W rows [0, rows) (rows <= panel_cols), columns [0, kc) of a row-major F32/BF16/F16
// matrix (w points at the first element, ldw in elements) into panel[kc][panel_cols]
// float32, transposed; rows past `rows` are zero. kc is a multiple of 32.
using PackPanelFn = void (*)(DType type, const void* w, int64_t ldw, int rows, int kc,
                             float* panel);

// y[r, c] (+)= sum_k x[r, k] * panel[k][c] for r < rows <= gemm_rows, c < cols <= panel_cols,
// with x packed by pack_rows.
using GemmPanelFn = void (*)(const float* xp, int rows, const float* panel, int kc, float* y,
                             int64_t ldy, int cols, bool accumulate);

// Small M: y[r, c] (+)= sum_k x[r, k] * W[c, k] for r < rows <= kDotRows, c < wrows <= kDotCols,
// k < K, reading W rows (row-major F32/BF16/F16, ldw in elements) directly.
constexpr int kDotRows = 4;
constexpr int kDotCols = 4;
using DotRowsFn = void (*)(DType type, const float* x, int64_t ldx, int rows, const void* w,
                           int64_t ldw, int wrows, int64_t K, float* y, int64_t ldy,
                           bool accumulate);

struct Kernels {
  Isa isa;
  int int_rows;    // most activation rows per tiles_q8 / tiles_q4 call
  int gemm_rows;   // most rows per gemm_panel call
  int panel_cols;  // columns of a packed float panel
  QuantizeRowsFn quantize_rows;
  TilesQ8Fn tiles_q8;
  TilesQ4Fn tiles_q4;
  PackRowsFn pack_rows;
  PackPanelFn pack_panel;
  GemmPanelFn gemm_panel;
  DotRowsFn dot_rows;
};

const Kernels& scalar_kernels();
#if defined(KLEIN_X86)
const Kernels& avx2_kernels();
const Kernels& avx512_kernels();
#endif
#if defined(KLEIN_ARM64)
const Kernels& neon_kernels();
#endif

}  // namespace klein::quant::detail
