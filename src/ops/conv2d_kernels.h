#pragma once
// Internal to conv2d.cpp: the direct (implicit-GEMM) convolution kernels per instruction set.
//
// They read a prepared band (conv2d.cpp fill_band: input rows upsampled, normalised and
// zero-padded, [C, band_rows, band_width]) and weights regrouped by pack_direct_weights, and
// compute stride-1 output rows without a column matrix: each input value is loaded straight
// from the band and multiplied into kDirectBlock output channels at once.
#include <cstdint>
#include <vector>

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

}  // namespace klein::ops::detail
