#pragma once
// Internal to conv2d.cpp: the direct (implicit-GEMM) convolution kernels per instruction set.
//
// They read a prepared band (conv2d.cpp fill_band: input rows upsampled, normalised and
// zero-padded, [C, band_rows, band_width]) and weights regrouped by pack_direct_weights, and
// compute stride-1 output rows without a column matrix: each input value is loaded straight
// from the band and multiplied into kDirectBlock output channels at once.
#include <cstdint>
#include <vector>

#include "ops/group_norm.h"

namespace klein::ops::detail {

// Output channels per weight group: weights [Cout, C, k, k] become
// [ceil(Cout / kDirectBlock)][C][k][k][kDirectBlock], zero past Cout.
constexpr int64_t kDirectBlock = 4;

struct DirectBand {
  const float* data = nullptr;  // [channels, rows, width]
  int64_t channels = 0, rows = 0, width = 0;
  int64_t kernel = 1;
};

// result[co·ld + x] = Σ_{c, ky, kx} w[co, c, ky, kx] · band[c, oy + ky, x + kx] for all
// co < out_channels and x in [x_begin, x_end) of output row oy (band-relative). `result`
// points at output row oy of channel 0. The sum runs in the order (c, ky, kx) for every
// value, so results do not depend on how rows and columns are split among threads.
void direct_conv_row_avx512(const DirectBand& band, const float* packed, int64_t out_channels,
                            int64_t oy, int64_t x_begin, int64_t x_end, float* result, int64_t ld);

// ---- BF16 tiles (AMX, conv2d_amx.cpp) ------------------------------------------------------
//
// The products as a GEMM on bf16 values with float32 sums, Y[Cout, pixels] = A[Cout, K] ·
// cols[K, pixels], one TDPBF16PS per 16 output channels x 16 pixels x 32 K values.
//
// K runs over (channel pair, ky, kx, channel in pair): K index ((cp·k + ky)·k + kx)·2 + i
// multiplies input channel 2cp + i at tap (ky, kx). Then the two values a B tile keeps in one
// dword (K pair p, pixel n) are the same pixel of channels 2cp and 2cp + 1, so a band stored
// with its channels interleaved in pairs is copied into the column matrix one dword per pixel
// and tap, with no shuffling. Input channels are padded to an even count and K to a multiple
// of kBf16TileK, both with zeros.
constexpr int64_t kBf16TileK = 32;       // K values per tile step (16 dword pair rows)
constexpr int64_t kBf16TileRows = 16;    // output channels per A / C tile
constexpr int64_t kBf16TilePixels = 16;  // pixels per B / C tile

// The band of Bf16Tiles: as DirectBand's (upsampled, normalised, zero-padded rows), channels
// interleaved in pairs and rounded to bf16. Dword x of row j of pair cp holds channel 2cp in
// its low half and channel 2cp + 1 in its high half.
struct Bf16Band {
  const uint32_t* data = nullptr;  // [pairs, rows, width] dwords
  int64_t pairs = 0, rows = 0, width = 0;
  int64_t kernel = 1, stride = 1;
};

// Weights as A tiles: bf16 [out_rows, k_padded] row-major, out_rows = Cout rounded up to
// kBf16TileRows, zero past Cout and past the real K. (Stored tile by tile instead, 1 KiB
// after 1 KiB, they ran no faster.)
struct Bf16Weights {
  const uint16_t* data = nullptr;
  int64_t out_channels = 0, out_rows = 0, k_padded = 0;
  const float* bias = nullptr;  // [out_channels] or null
};

// out[x·repeat + i] = bf16(f(a[x])) | bf16(g(b[x])) << 16 for x < n, i < repeat (nearest-
// neighbour upsampling when repeat > 1), rounded to nearest even, where f and g are the
// transform of channels c and c + 1 (identity when t is null), computed with the very
// operations of ChannelAffine::apply, so the values are those of the exact paths rounded once.
// b may be null: a zero channel.
void pack_pairs_amx(const float* a, const float* b, int64_t n, const ChannelAffine* t, int64_t c,
                    uint32_t* out, int64_t repeat = 1);

// Dwords of column-matrix scratch that bf16_tiles_conv_amx needs for `pixels` pixels.
int64_t bf16_columns_size(const Bf16Band& band, const Bf16Weights& w, int64_t pixels);

// Output pixels [p0, p0 + n) of a band (pixel p = band output row p / out_width, column
// p % out_width): builds their column matrix in `columns` (bf16_columns_size dwords, 64-byte
// aligned), multiplies it on AMX tiles for every output channel and writes
// out[co·ld + p] = sum + bias[co] (accumulate: out[co·ld + p] += sum + bias[co]), `out`
// pointing at the band's first output pixel of channel 0. Configures the tiles itself and
// releases them on return. Every output value is one chain of tile products over K in a fixed
// order, whatever p0 and n are.
void bf16_tiles_conv_amx(const Bf16Band& band, const Bf16Weights& w, int64_t out_width,
                         int64_t p0, int64_t n, uint32_t* columns, float* out, int64_t ld,
                         bool accumulate);

// ---- BF16 direct (AVX-512 BF16 without AMX, conv2d_avx512.cpp) -------------------------------
//
// direct_conv_row_avx512 on a Bf16Band (stride 1) with VDPBF16PS: weights as dwords
// [ceil(Cout / kDirectBlock)][pairs][k][k][kDirectBlock], each the bf16 weights of channels
// 2cp (low half) and 2cp + 1 (high half), zero past Cout and for a missing odd channel. Every
// output value is one chain over (pair, ky, kx) in that order, whatever the split.
void direct_conv_row_bf16_avx512(const Bf16Band& band, const uint32_t* packed,
                                 int64_t out_channels, int64_t oy, int64_t x_begin, int64_t x_end,
                                 float* result, int64_t ld);

}  // namespace klein::ops::detail
