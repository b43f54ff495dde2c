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

// The integer kernels of one instruction set (Q8 / Q4 weights, int8 activations). Float
// weights are not multiplied here: ops::linear sends them to OpenBLAS, or on AMX CPUs to the
// tile kernels below.
struct Kernels {
  Isa isa;
  int int_rows;  // most activation rows per tiles_q8 / tiles_q4 call
  QuantizeRowsFn quantize_rows;
  TilesQ8Fn tiles_q8;
  TilesQ4Fn tiles_q4;
};

// ---- AMX (Isa::Amx): BF16 tiles from M >= kAmxMinRows ---------------------------------------
// Q8 / Q4 weights: each weight tile is dequantized to bf16 and the activations are rounded to
// bf16 (8 significant bits; no block scales, so no integer fix-ups). BF16 weights are bf16
// already; there the activations are split into three bf16 parts x = hi + mid + lo (8 + 8 + 8
// significant bits hold all 24 of a float32), each multiplied by the same weight tile into the
// same float32 sums: exact float32 inputs at a third of the tile rate, still several times the
// float32 FMA rate. Tile shapes: A = 16 rows x 32 bf16 of X (row-major), B = 16 weight rows x
// 32 columns as 16 column pairs x 16 rows x 2 bf16 (the pair layout TDPBF16PS reads), C = 16 x
// 16 float32 of Y.
constexpr int64_t kAmxMinRows = 32;
constexpr int kAmxBlockRows = 32;         // rows of X per micro-kernel call (two A tiles)
constexpr size_t kAmxTileElements = 512;  // bf16 values in one A or B tile
constexpr int kAmxMaxSplits = 3;          // bf16 parts per activation, at most

// Work the block kernel does between its tile products: run(context, i) for i < pieces,
// spread over its steps. The products run on the tile unit and this on the vector units, so
// work that the next call needs (converting its weight tiles, quant/matmul.cpp) costs little
// time beside them. It must not write what the call reads.
struct AmxSideWork {
  void (*run)(const void* context, int64_t piece);
  const void* context;
  int64_t pieces;  // run(context, i) for i = 0 .. pieces - 1, in order
};

struct AmxKernels {
  // Loads this thread's tile configuration; call at the start of every task (the tile state
  // is per thread) and release() at its end.
  void (*configure)();
  void (*release)();
  // Rows [0, rows) (rows <= kAmxBlockRows), columns [0, kc) (kc % 32 == 0) of x as `splits`
  // (1 or 3) bf16 arrays of kAmxBlockRows rows, `ldo` >= kc elements apart: part s of x[r, k]
  // at out[(s * kAmxBlockRows + r) * ldo + k]. One part: x rounded to bf16. Three: hi =
  // bf16(x), mid = bf16(x - hi), lo = bf16(x - hi - mid), whose sum is x (both differences
  // are exact in float32; only parts below 2^-126, which bf16 conversion flushes, are lost).
  // Rows past `rows` are zero (columns [0, kc) of them).
  void (*rows_to_bf16)(const float* x, int64_t ldx, int rows, int kc, int splits, uint16_t* out,
                       int64_t ldo);
  // `count` consecutive TileQ8 / TileQ4 (of one 16-row group) as B tiles, kAmxTileElements
  // bf16 each (reached through the storage type's table, quant/types.h).
  void (*q8_tiles_to_bf16)(const TileQ8* tiles, int64_t count, uint16_t* out);
  void (*q4_tiles_to_bf16)(const TileQ4* tiles, int64_t count, uint16_t* out);
  // out[32 x 16 * groups] = (c if given, else 0) + sum over the parts s < splits of
  // a_s[32 rows, 32 nb] * B^T, for 1 or 2 groups of B tiles (b0, b1; nb consecutive tiles
  // each, b1 unused when groups == 1). a_s = a + s * kAmxBlockRows * lda, rows lda elements
  // apart; c rows ldc floats apart, out rows ldo apart (out may be c). `side` (or null): work
  // to do on the way.
  void (*block)(const uint16_t* a, int64_t lda, int splits, const uint16_t* b0,
                const uint16_t* b1, int groups, int64_t nb, const float* c, int64_t ldc,
                float* out, int64_t ldo, const AmxSideWork* side);
};

const Kernels& scalar_kernels();
#if defined(KLEIN_X86)
// The AVX2-class tiles this CPU runs best: AVX-VNNI's where it has it, else the VPMADDUBSW
// tiles (avx2_pair_kernels); KLEIN_ISA=avx2 lowers the choice to the latter.
const Kernels& avx2_kernels();
const Kernels& avx2_pair_kernels();
// The VPDPBUSD (ymm) tiles of kernels_avxvnni.cpp with the given activation quantizer.
Kernels avx_vnni_kernels(QuantizeRowsFn quantize_rows);
const Kernels& avx512_kernels();
const AmxKernels& amx_kernels();
#endif
#if defined(KLEIN_ARM64)
// Activation rows per NEON tile call, in kernels_neon.cpp and kernels_neon_i8mm.cpp alike.
constexpr int kNeonIntRows = 8;
// SDOT tiles where the CPU has FEAT_DotProd, SMMLA tiles where it has FEAT_I8MM, widening
// multiplies otherwise; KLEIN_ISA=neon-dotprod / neon lower the choice.
const Kernels& neon_kernels();
// The SMMLA tiles (kernels_neon_i8mm.cpp) with the given activation quantizer.
Kernels neon_i8mm_kernels(QuantizeRowsFn quantize_rows);
#endif

}  // namespace klein::quant::detail
