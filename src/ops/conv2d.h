#pragma once
// 2-D convolution over [C, H, W] float32 activations (batch 1), computed in bands of output
// rows so that working memory stays a few tens of MiB at any image size. Per band the input
// rows are prepared once (below), then either a direct SIMD kernel reads them (stride 1) or
// they are expanded tile by tile into an im2col matrix for a GEMM (ops/gemm.h, the weights
// packed once per call).
//
// Two input transforms are fused into the gathering of columns, so their results never
// exist as full tensors:
//   - nearest-neighbour upsampling by an integer factor (the VAE decoder's Upsample2D);
//   - a per-channel affine map with optional SiLU (GroupNorm + SiLU, see group_norm.h).
// Zero padding is applied after both, as in PyTorch where the conv pads its own input.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "ops/group_norm.h"

namespace klein::ops {

struct Conv2dWeights {
  int64_t out_channels = 0;
  int64_t in_channels = 0;
  int64_t kernel = 1;         // square kernels only
  std::vector<float> weight;  // [out, in, kernel, kernel] (PyTorch layout)
  std::vector<float> bias;    // [out], or empty for none
};

// How the products are computed. Auto picks the fastest exact (float32) one for the geometry:
// the direct SIMD kernel for stride 1 on CPUs that have one, im2col + GEMM otherwise. When
// the context's arithmetic says fast_convolutions it picks Bf16Tiles if the CPU has AMX, else
// Winograd for 3x3 stride-1 convolutions of 16 channels or more, else (conv_out's 3 output
// channels) Bf16Direct where VDPBF16PS outruns FMA. The others force a path (tests,
// benchmarks).
//   Bf16Tiles: im2col + GEMM on AMX tiles, inputs (after the transform) and weights rounded to
//   bf16 (8 significant bits), products summed in float32: max|y - exact| is 1e-3 to 3e-3 of
//   max|y| on random data (tests/ops/conv2d_bf16_test.cpp), and 3-6x faster than the exact
//   paths (bench_vae BM_Conv3x3). Bias and accumulation stay float32.
//   Bf16Direct: the direct kernel on the same bf16-rounded operands with VDPBF16PS (AVX-512
//   BF16 without AMX, e.g. AMD Zen 4; stride 1): the same error as Bf16Tiles, about twice the
//   exact direct kernel's speed. Auto picks it, when fast_convolutions asks, on such CPUs for
//   the layers Winograd does not take: on Zen 4 Winograd is faster still at the VAE's wide
//   layers (bench_vae BM_Conv3x3: 194 against 289 ms at 128 channels, 154 against 204 ms at
//   512; docs/SPEED.md) and 50 times as exact.
//   Winograd: 3x3, stride 1, float32 on every CPU: F(4x4, 3x3) tiles whose 36 transformed
//   points are GEMMs over the channels (conv2d_winograd.h), 2.25 multiply-adds per output value
//   and channel instead of 9. Within 2e-5 of max|y| of the exact sums (tests/ops/
//   conv2d_winograd_test.cpp).
enum class ConvAlgorithm { Auto, Gemm, Direct, Bf16Tiles, Bf16Direct, Winograd };

struct Conv2dParams {
  int64_t stride = 1;
  // Zero padding of the (upsampled) input on each side; may be asymmetric, e.g. the VAE
  // downsampler pads only right and bottom.
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t upsample = 1;  // nearest-neighbour factor applied to the input first
  ConvAlgorithm algorithm = ConvAlgorithm::Auto;
  // The row of a larger output that this call's output row 0 is, when the input holds only
  // the rows a band of that output reads (the VAE's banded decoder). The work is split into
  // bands of conv2d_band_rows rows and GEMM tiles laid out from row 0 of the larger output,
  // so an output value comes from the same arithmetic as in the whole-image call, bit for bit,
  // when the call holds the whole band of that row (and, for a 1x1 convolution without
  // transform, the whole conv2d_tile_pixels tile of its pixel). A GEMM's sums may depend on a
  // column's place in the call (BLAS libraries' do), so the layout is kept for any GEMM.
  int64_t origin_row = 0;
  // Output rows at the top and bottom that the caller will not read (the halo rows of the
  // VAE's bands, which another band computes). The bands of the layout above that hold
  // none of the other rows are not computed and the rows of `out` they cover are left as
  // they are (1x1 convolutions without a transform compute and write every row; in place,
  // nothing may be skipped). The rows that are computed keep their bits.
  int64_t skip_top = 0, skip_bottom = 0;

  // Stride 1 with kernel/2 zeros on every side: output size = input size.
  static Conv2dParams same(int64_t kernel);
};

struct ConvInput {
  const float* data = nullptr;  // [channels, height, width]
  int64_t channels = 0, height = 0, width = 0;
  const ChannelAffine* transform = nullptr;  // applied to every value read, or none
};

enum class ConvWrite {
  Overwrite,   // out = conv(in)
  Accumulate,  // out = out + conv(in)   (a residual connection for free)
};

// Whether ConvAlgorithm::Direct can run here (stride 1 on a CPU with AVX-512).
bool conv2d_direct_available(const Compute& cx);
bool conv2d_direct_available();  // with the best instruction set of this CPU (KLEIN_ISA)
// Whether ConvAlgorithm::Bf16Tiles can run here (any geometry, on a CPU with AMX BF16 that
// the OS lets this process use).
bool conv2d_bf16_tiles_available(const Compute& cx);
bool conv2d_bf16_tiles_available();  // with the best instruction set of this CPU (KLEIN_ISA)
// Whether ConvAlgorithm::Bf16Direct can run here (AVX-512 with BF16 dot products; stride 1).
bool conv2d_bf16_direct_available(const Compute& cx);
bool conv2d_bf16_direct_available();  // with the best instruction set of this CPU (KLEIN_ISA)
// Whether Auto with Arithmetic::fast_convolutions multiplies on bf16 operands with the best
// instruction set of this CPU: on AMX tiles everywhere, or with the direct kernel where
// VDPBF16PS outruns FMA (CpuFeatures::avx512_bf16_fast) for the layers Winograd does not
// take (conv_out); elsewhere it uses Winograd in float32 and the exact kernels.
bool conv2d_bf16_auto_available();

// Output rows of the bands conv2d computes at a time for an output width (about 8192 pixels
// per band, a multiple of 4 rows where that is 4 or more), and the pixels per GEMM tile of a
// 1x1 convolution; see Conv2dParams::origin_row.
int64_t conv2d_band_rows(int64_t out_width);
int64_t conv2d_tile_pixels();

// Output extent of one axis.
int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_before,
                           int64_t pad_after, int64_t upsample);

// out: [w.out_channels, OH, OW]. `out` may be `in.data` (in place) when the output has the
// input's size and no more channels (stride 1, no upsampling): bands are written back only
// after the next band has gathered the rows it shares with them.
// Results do not depend on the thread count: every output value comes from one GEMM tile of
// fixed shape (with Bf16Tiles too).
void conv2d(const ConvInput& in, const Conv2dWeights& w, const Conv2dParams& p, float* out,
            ConvWrite mode, Compute& cx);

// Tensor forms, x and y [C, H, W].
Tensor conv2d(const Tensor& x, const Conv2dWeights& w, const Conv2dParams& p, Compute& cx,
              const ChannelAffine* transform = nullptr);
void conv2d_into(const Tensor& x, const ChannelAffine* transform, const Conv2dWeights& w,
                 const Conv2dParams& p, Tensor& y, ConvWrite mode, Compute& cx);

}  // namespace klein::ops
