#pragma once
// Internal to conv2d.cpp: 3x3 stride-1 convolutions of a prepared band (conv2d.cpp fill_band)
// as Winograd F(4x4, 3x3) products (winograd_kernels.h): 36 float32 GEMMs over the channels
// (ops/gemm.h) between an input and an output transform, 2.25 multiply-adds per output value and
// input channel where the direct kernel does 9.
//
// The transforms add and subtract values up to 8 times larger than the result before they
// cancel, so the result is less exact than the direct sums: within 2e-5 of max|y| on random
// data (tests/ops/conv2d_winograd_test.cpp) where float32 direct sums are within 1e-6, and a
// hundred times closer than the bf16 operands of the other fast paths.
#include <cstddef>
#include <cstdint>

#include "ops/compute.h"
#include "ops/conv2d.h"
#include "ops/conv2d_kernels.h"

namespace klein::ops::detail {

// Floats of the transformed weights: for each of the 36 points, U[ξ] [Cout, C] as gemm_pack_a
// packs an A for the GEMMs of cx.isa().
size_t winograd_weights_size(const Conv2dWeights& w, const Compute& cx);
void pack_winograd_weights(const Conv2dWeights& w, float* packed, Compute& cx);

// Floats of slack past the end of a band that winograd_band may read (and not use).
constexpr int64_t kWinogradBandSlack = 16;

// result[co·ld + y·out_width + x] = Σ_{c, ky, kx} w[co, c, ky, kx] · band[c, y + ky, x + kx] for
// every output channel co, y < rows and x < out_width, where band (kernel 3) holds rows + 2
// rows of out_width + 2 values and is readable kWinogradBandSlack floats past its end. Tiles
// of 4x4 output values are laid out from the band's row 0 and column 0, and rows and columns
// of tiles past the band read zeros, so every output value depends on the band and the
// weights only, not on the threads.
void winograd_band(const DirectBand& band, int64_t rows, int64_t out_width, const float* packed,
                   int64_t out_channels, float* result, int64_t ld, Compute& cx);

}  // namespace klein::ops::detail
