#include "ops/conv2d.h"


#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "core/cpu.h"
#include "core/error.h"
#include "core/tensor.h"
#include "ops/conv2d_kernels.h"
#include "ops/conv2d_winograd.h"
#include "ops/gemm.h"

namespace klein::ops {

namespace {

// Output pixels per band: bounds the band buffers (a few MiB to a few tens of MiB) at any
// image size while giving every thread several GEMM tiles.
constexpr int64_t kBandPixels = 8192;
// Output pixels per GEMM tile. A constant, not derived from the thread count, so every output
// value comes from the same gemm call whatever the thread count. Each call packs the whole
// weight matrix once, so wider tiles spread that cost; the tile's column matrix is
// K x kTileColumns floats (9 MiB at K = 4608).
constexpr int64_t kTileColumns = 512;
// Output pixels of one row per direct-kernel task: two full 96-pixel register tiles, and
// five or six tasks per row at 1024 columns so every thread has work.
constexpr int64_t kDirectSegment = 192;

struct ConvGeometry {
  int64_t in_channels = 0, in_height = 0, in_width = 0;  // as stored
  int64_t height = 0, width = 0;                         // after upsampling
  int64_t out_channels = 0, out_height = 0, out_width = 0;
  int64_t kernel = 1, stride = 1, upsample = 1, pad_top = 0, pad_left = 0, pad_right = 0;
  int64_t origin_row = 0;  // Conv2dParams::origin_row
  int64_t band = 1;        // output rows per band of the full output (the last may be shorter)
  int64_t need0 = 0, need1 = 0;  // the output rows wanted: [skip_top, out_height - skip_bottom)

  int64_t column_rows() const { return in_channels * kernel * kernel; }  // GEMM K
  int64_t out_pixels() const { return out_height * out_width; }
  // A band row: one upsampled input row with its zero padding on both sides.
  int64_t band_width() const { return pad_left + width + pad_right; }
  // Band rows read by `rows` output rows.
  int64_t band_rows(int64_t rows) const { return (rows - 1) * stride + kernel; }
  // Rows of this call's band starting at its output row r0: up to the end of the full
  // output's band that row belongs to (bands are laid out from row 0 of the full output).
  int64_t band_at(int64_t r0) const {
    return std::min(out_height - r0, band - (origin_row + r0) % band);
  }
  // The largest band of this call (its buffers' size).
  int64_t widest_band() const { return std::min(band, out_height); }
  // The first row of the first band that holds a wanted row: bands run from there while
  // they start before need1.
  int64_t first_band_row() const {
    return std::max<int64_t>(0, need0 - (origin_row + need0) % band);
  }
};

ConvGeometry geometry_of(const ConvInput& in, const Conv2dWeights& w, const Conv2dParams& p) {
  check(w.kernel >= 1 && w.out_channels >= 1 && w.in_channels >= 1, "conv2d: invalid weights [",
        w.out_channels, ", ", w.in_channels, ", ", w.kernel, ", ", w.kernel, "]");
  check(int64_t(w.weight.size()) == w.out_channels * w.in_channels * w.kernel * w.kernel,
        "conv2d: weight holds ", w.weight.size(), " values, expected [", w.out_channels, ", ",
        w.in_channels, ", ", w.kernel, ", ", w.kernel, "]");
  check(w.bias.empty() || int64_t(w.bias.size()) == w.out_channels, "conv2d: bias holds ",
        w.bias.size(), " values for ", w.out_channels, " output channels");
  check(in.channels == w.in_channels, "conv2d: input has ", in.channels,
        " channels, the weights expect ", w.in_channels);
  check(!in.transform || in.transform->channels() == in.channels, "conv2d: input transform for ",
        in.transform ? in.transform->channels() : 0, " channels, input has ", in.channels);
  check(p.stride >= 1 && p.upsample >= 1 && p.pad_top >= 0 && p.pad_bottom >= 0 &&
            p.pad_left >= 0 && p.pad_right >= 0,
        "conv2d: invalid stride, padding or upsampling factor");
  ConvGeometry g;
  g.in_channels = in.channels;
  g.in_height = in.height;
  g.in_width = in.width;
  g.height = in.height * p.upsample;
  g.width = in.width * p.upsample;
  g.out_channels = w.out_channels;
  g.out_height =
      conv2d_output_size(in.height, w.kernel, p.stride, p.pad_top, p.pad_bottom, p.upsample);
  g.out_width =
      conv2d_output_size(in.width, w.kernel, p.stride, p.pad_left, p.pad_right, p.upsample);
  g.kernel = w.kernel;
  g.stride = p.stride;
  g.upsample = p.upsample;
  g.pad_top = p.pad_top;
  g.pad_left = p.pad_left;
  g.pad_right = p.pad_right;
  check(p.origin_row >= 0, "conv2d: negative origin row ", p.origin_row);
  g.origin_row = p.origin_row;
  g.band = conv2d_band_rows(g.out_width);
  check(g.out_height >= 1 && g.out_width >= 1, "conv2d: a ", in.height, "x", in.width,
        " input is too small for a ", w.kernel, "x", w.kernel, " kernel");
  check(p.skip_top >= 0 && p.skip_bottom >= 0 && p.skip_top + p.skip_bottom < g.out_height,
        "conv2d: skipping ", p.skip_top, " and ", p.skip_bottom, " of ", g.out_height,
        " output rows");
  g.need0 = p.skip_top;
  g.need1 = g.out_height - p.skip_bottom;
  check(g.column_rows() < INT_MAX && g.out_pixels() < INT_MAX && in.height * in.width < INT_MAX,
        "conv2d: ", in.height, "x", in.width, "x", in.channels, " input is too large");
  return g;
}

// The input rows that output rows [r0, r0 + rows) read, as the kernel sees them: upsampled,
// transformed, with the zero padding written out. band [C, band_rows(rows), band_width()].
// Each input value is transformed once here, not k² times in the column matrix.
void fill_band(const ConvInput& in, const ConvGeometry& g, int64_t r0, int64_t rows, float* band,
               Compute& cx) {
  const int64_t band_rows = g.band_rows(rows), bw = g.band_width();
  cx.pool().parallel_for(g.in_channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t j = 0; j < band_rows; ++j) {
        float* dst = band + (c * band_rows + j) * bw;
        const int64_t y = r0 * g.stride - g.pad_top + j;  // upsampled input row
        if (y < 0 || y >= g.height) {
          std::fill(dst, dst + bw, 0.0f);
          continue;
        }
        const float* src = in.data + (c * g.in_height + y / g.upsample) * g.in_width;
        std::fill(dst, dst + g.pad_left, 0.0f);
        float* row = dst + g.pad_left;
        if (g.upsample == 1)
          std::memcpy(row, src, size_t(g.width) * sizeof(float));
        else
          for (int64_t x = 0; x < g.width; ++x) row[x] = src[x / g.upsample];
        if (in.transform) in.transform->apply(c, row, row, g.width);
        std::fill(row + g.width, dst + bw, 0.0f);
      }
  });
}

// The column matrix of band pixels [p0, p0 + n) (pixel p = output row p / OW of the band,
// column p % OW): row (c·k + ky)·k + kx holds the band value each pixel multiplies with
// weight [·, c, ky, kx]. columns [K, n], contiguous, so gemm packs it with unit strides.
void gather_tile(const ConvGeometry& g, const float* band, int64_t band_rows, int64_t p0, int64_t n,
                 float* columns) {
  const int64_t k = g.kernel, ow = g.out_width, bw = g.band_width();
  for (int64_t c = 0; c < g.in_channels; ++c)
    for (int64_t ky = 0; ky < k; ++ky)
      for (int64_t kx = 0; kx < k; ++kx) {
        float* dst = columns + ((c * k + ky) * k + kx) * n;
        for (int64_t p = p0; p < p0 + n;) {
          const int64_t oy = p / ow, ox = p % ow, run = std::min(ow - ox, p0 + n - p);
          const float* src = band + (c * band_rows + oy * g.stride + ky) * bw + ox * g.stride + kx;
          if (g.stride == 1)
            std::memcpy(dst, src, size_t(run) * sizeof(float));
          else
            for (int64_t i = 0; i < run; ++i) dst[i] = src[i * g.stride];
          dst += run;
          p += run;
        }
      }
}

// The weights W [Cout, K] packed once per call for every tile's gemm (ops/gemm.h), in the
// calling thread's arena.
const float* pack_weights(const Conv2dWeights& w, Arena::Scope& scratch, const Compute& cx) {
  const int64_t K = w.in_channels * w.kernel * w.kernel;
  float* packed = scratch.take<float>(gemm_packed_a_floats(w.out_channels, K, cx.isa()));
  gemm_pack_a(w.weight.data(), K, w.out_channels, K, cx.isa(), packed);
  return packed;
}

// result [Cout, n] (row stride ldc) = W · b [K, n] (row stride ldb) (+ result), W as
// pack_weights packed it; the packing buffer from the worker's arena.
void conv_gemm(const Conv2dWeights& w, const float* packed_w, const float* b, int64_t n,
               int64_t ldb, float* result, int64_t ldc, bool accumulate, Compute& cx, int worker) {
  Arena::Scope scratch(cx.arena(worker));
  ops::gemm({.M = w.out_channels, .N = n, .K = w.in_channels * w.kernel * w.kernel, .b = b,
             .ldb = ldb, .c = result, .ldc = ldc, .accumulate = accumulate, .a_packed = packed_w},
            cx.isa(), scratch.take<float>(gemm_pack_floats()));
}

// Rows [r0, r0 + rows) of every output channel from a band result [Cout, rows·OW].
void write_band(const float* result, const ConvGeometry& g, const Conv2dWeights& w, int64_t r0,
                int64_t rows, float* out, ConvWrite mode, Compute& cx) {
  const int64_t n = rows * g.out_width;
  cx.pool().parallel_for(g.out_channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t co = c0; co < c1; ++co) {
      const float* r = result + co * n;
      float* o = out + co * g.out_pixels() + r0 * g.out_width;
      const float b = w.bias.empty() ? 0.0f : w.bias[size_t(co)];
      if (mode == ConvWrite::Accumulate)
        for (int64_t i = 0; i < n; ++i) o[i] += r[i] + b;
      else
        for (int64_t i = 0; i < n; ++i) o[i] = r[i] + b;
    }
  });
}

// Result [Cout, rows·OW] of one band as im2col + GEMM, one task per tile of pixels (its
// column matrix in the worker's arena).
void gemm_band(const ConvGeometry& g, const Conv2dWeights& w, const float* packed_w,
               const float* band_input, int64_t rows, float* result, Compute& cx) {
  const int64_t tile_columns = kTileColumns;
  const int64_t n = rows * g.out_width;
  cx.pool().for_each_task((n + tile_columns - 1) / tile_columns, [&](int64_t t, int worker) {
    Arena::Scope scratch(cx.arena(worker));
    float* cols = scratch.take<float>(size_t(g.column_rows() * tile_columns));
    const int64_t p0 = t * tile_columns, width = std::min(tile_columns, n - p0);
    gather_tile(g, band_input, g.band_rows(rows), p0, width, cols);
    conv_gemm(w, packed_w, cols, width, width, result + p0, n, false, cx, worker);
  });
}

// Auto's choice, from bench_vae BM_Conv3x3 (one thread, AVX-512 Xeon): the direct kernel is
// about 10% faster than OpenBLAS when K = C·k² <= 2304 (the VAE's full-resolution levels,
// 128 and 256 channels), 2.6x faster for a few output channels (conv_out, where GEMM rows
// are wasted), and about 25% slower at 512 channels, where OpenBLAS's cache blocking wins.
bool use_direct(const ConvGeometry& g, const Conv2dParams& p, const Compute& cx) {
  if (p.algorithm == ConvAlgorithm::Gemm) return false;
  const bool available = g.stride == 1 && conv2d_direct_available(cx);
  check(available || p.algorithm != ConvAlgorithm::Direct,
        "conv2d: the direct kernel needs stride 1 and AVX-512");
  if (p.algorithm == ConvAlgorithm::Direct) return true;
  return available && (g.out_channels < 16 || g.column_rows() <= 2304);
}

// Winograd when forced, or when asked for fast convolutions (after AMX tiles) for a 3x3
// stride-1 convolution wide enough for its GEMMs: 16 channels in and out (conv_out's 3 output
// channels would waste most of each GEMM tile's rows), and bands of whole rows of 4x4 tiles
// (not for outputs over 2048 pixels wide, whose bands are 1 to 3 rows).
bool use_winograd(const ConvGeometry& g, const Conv2dParams& p, const Compute& cx) {
  const bool fits = g.kernel == 3 && g.stride == 1;
  if (p.algorithm == ConvAlgorithm::Winograd) {
    check(fits, "conv2d: Winograd needs a 3x3 kernel and stride 1, not ", g.kernel, "x", g.kernel,
          " with stride ", g.stride);
    return true;
  }
  return p.algorithm == ConvAlgorithm::Auto && cx.arithmetic.fast_convolutions && fits &&
         g.in_channels >= 16 && g.out_channels >= 16 && g.band >= 4;
}

// Floats of the direct kernel's weights: output channels in groups of kDirectBlock.
size_t direct_weights_size(const Conv2dWeights& w) {
  const int64_t groups = (w.out_channels + detail::kDirectBlock - 1) / detail::kDirectBlock;
  return size_t(groups * w.in_channels * w.kernel * w.kernel * detail::kDirectBlock);
}

void pack_direct_weights(const Conv2dWeights& w, float* packed) {
  const int64_t taps = w.in_channels * w.kernel * w.kernel;
  std::fill(packed, packed + direct_weights_size(w), 0.0f);
  for (int64_t co = 0; co < w.out_channels; ++co)
    for (int64_t t = 0; t < taps; ++t)
      packed[size_t(((co / detail::kDirectBlock) * taps + t) * detail::kDirectBlock +
                    co % detail::kDirectBlock)] = w.weight[size_t(co * taps + t)];
}

// Result [Cout, rows·OW] of one band with the direct kernel, in tasks of one row segment.
void direct_band(const ConvGeometry& g, const float* band_input, int64_t rows, const float* packed,
                 float* result, Compute& cx) {
  const detail::DirectBand band{band_input, g.in_channels, g.band_rows(rows), g.band_width(),
                                g.kernel};
  const int64_t segments = (g.out_width + kDirectSegment - 1) / kDirectSegment;
  const int64_t n = rows * g.out_width;
  cx.pool().for_each_task(rows * segments, [&](int64_t t, int) {
    const int64_t oy = t / segments, x0 = t % segments * kDirectSegment;
    const int64_t x1 = std::min(g.out_width, x0 + kDirectSegment);
#if defined(KLEIN_X86)
    detail::direct_conv_row_avx512(band, packed, g.out_channels, oy, x0, x1,
                                   result + oy * g.out_width, n);
#else
    (void)oy, (void)x0, (void)x1, (void)n, (void)band, (void)result;
    fail("conv2d: no direct kernel in this build");
#endif
  });
}

// ---- BF16 tiles ----------------------------------------------------------------------------

// Column matrix per task, in bytes: the task's pixels are as many as fit, so that the columns
// and the A tiles of 32 output channels (K x 64 bytes) stay in L2 together while the tiles
// run. Never fewer than 32 pixels (one 2 x 2 tile block).
constexpr int64_t kBf16ColumnBytes = int64_t(1) << 20;
constexpr int64_t kBf16MaxTilePixels = 512;

bool use_bf16_tiles(const Conv2dParams& p, const Compute& cx) {
  if (p.algorithm == ConvAlgorithm::Bf16Tiles) {
    check(conv2d_bf16_tiles_available(cx), "conv2d: BF16 tiles need a CPU with AMX BF16");
    return true;
  }
  return p.algorithm == ConvAlgorithm::Auto && cx.arithmetic.fast_convolutions &&
         conv2d_bf16_tiles_available(cx);
}

// Bf16Direct when forced, or when asked for bf16 convolutions on a CPU with AVX-512 BF16 but
// no AMX tiles (which take precedence) whose VDPBF16PS outruns its FMAs (AMD; on Intel cores
// the float32 direct kernel is faster: 2.80 against 3.52 s for a 256x256 decode, SPEED.md),
// for the layers Winograd does not take (conv2d asks use_winograd first).
bool use_bf16_direct(const ConvGeometry& g, const Conv2dParams& p, const Compute& cx) {
  const bool available = g.stride == 1 && conv2d_bf16_direct_available(cx);
  if (p.algorithm == ConvAlgorithm::Bf16Direct) {
    check(available, "conv2d: the BF16 direct kernel needs stride 1 and AVX-512 BF16");
    return true;
  }
  return p.algorithm == ConvAlgorithm::Auto && cx.arithmetic.fast_convolutions && available &&
         cpu_features().avx512_bf16_fast;
}

// Weights as the BF16 direct kernel reads them (conv2d_kernels.h): dwords
// [ceil(Cout / kDirectBlock)][pairs][k][k][kDirectBlock], rounded to nearest even.
size_t bf16_direct_weights_size(const Conv2dWeights& w) {
  const int64_t groups = (w.out_channels + detail::kDirectBlock - 1) / detail::kDirectBlock;
  return size_t(groups * (w.in_channels + 1) / 2 * w.kernel * w.kernel * detail::kDirectBlock);
}

uint32_t bf16_bits(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // finite weights
}

void pack_bf16_direct_weights(const Conv2dWeights& w, uint32_t* packed) {
  const int64_t taps = w.kernel * w.kernel, pairs = (w.in_channels + 1) / 2;
  std::fill(packed, packed + bf16_direct_weights_size(w), 0u);
  for (int64_t co = 0; co < w.out_channels; ++co)
    for (int64_t c = 0; c < w.in_channels; ++c)
      for (int64_t t = 0; t < taps; ++t) {
        const size_t at = size_t((((co / detail::kDirectBlock) * pairs + c / 2) * taps + t) *
                                     detail::kDirectBlock +
                                 co % detail::kDirectBlock);
        packed[at] |= bf16_bits(w.weight[size_t((co * w.in_channels + c) * taps + t)])
                      << (c % 2 ? 16 : 0);
      }
}

#if defined(KLEIN_X86)

using WordBuffer = std::unique_ptr<uint32_t[], FreeAligned>;

// Weights [Cout, C, k, k] as A tiles (conv2d_kernels.h): bf16 [Cout rounded up to 16, K
// rounded up to 32], K index ((cp·k + ky)·k + kx)·2 + i for input channel 2cp + i.
std::unique_ptr<uint16_t[], FreeAligned> pack_bf16_weights(const Conv2dWeights& w,
                                                           detail::Bf16Weights& packed,
                                                           Compute& cx) {
  const int64_t taps = w.kernel * w.kernel, pairs = (w.in_channels + 1) / 2;
  packed.out_channels = w.out_channels;
  packed.out_rows = round_up(w.out_channels, detail::kBf16TileRows);
  packed.k_padded = round_up(pairs * taps * 2, detail::kBf16TileK);
  packed.bias = w.bias.empty() ? nullptr : w.bias.data();
  auto data = alloc_aligned<uint16_t>(size_t(packed.out_rows * packed.k_padded));
  cx.pool().parallel_for(packed.out_rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t co = r0; co < r1; ++co) {
      uint16_t* row = data.get() + co * packed.k_padded;
      std::fill(row, row + packed.k_padded, uint16_t(0));
      if (co >= w.out_channels) continue;
      // The taps of channels 2cp and 2cp + 1 interleaved, as the band interleaves the pixels.
      const float* src = w.weight.data() + co * w.in_channels * taps;
      for (int64_t cp = 0; cp < pairs; ++cp)
        detail::pack_pairs_amx(src + 2 * cp * taps,
                               2 * cp + 1 < w.in_channels ? src + (2 * cp + 1) * taps : nullptr,
                               taps, nullptr, 0, reinterpret_cast<uint32_t*>(row) + cp * taps);
    }
  });
  packed.data = data.get();
  return data;
}

// fill_band for BF16 tiles: the same rows (upsampled, transformed, zero-padded), with the
// channels interleaved in pairs and rounded to bf16. band [pairs, band_rows(rows), band_width()]
// dwords. Each input value is transformed once, then repeated when upsampling.
void fill_band_bf16(const ConvInput& in, const ConvGeometry& g, int64_t r0, int64_t rows,
                    uint32_t* band, Compute& cx) {
  const int64_t band_rows = g.band_rows(rows), bw = g.band_width();
  const int64_t pairs = (g.in_channels + 1) / 2;
  cx.pool().parallel_for(pairs * band_rows, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t cp = i / band_rows, j = i % band_rows;
      uint32_t* dst = band + i * bw;
      const int64_t y = r0 * g.stride - g.pad_top + j;  // upsampled input row
      if (y < 0 || y >= g.height) {
        std::fill(dst, dst + bw, 0u);
        continue;
      }
      const int64_t c = 2 * cp, plane = g.in_height * g.in_width;
      const float* a = in.data + c * plane + (y / g.upsample) * g.in_width;
      const float* b = c + 1 < g.in_channels ? a + plane : nullptr;
      uint32_t* row = dst + g.pad_left;
      detail::pack_pairs_amx(a, b, g.in_width, in.transform, c, row, g.upsample);
      std::fill(dst, dst + g.pad_left, 0u);
      std::fill(row + g.width, dst + bw, 0u);
    }
  });
}

void bf16_tiles_conv(const ConvInput& in, const ConvGeometry& g, const Conv2dWeights& w, float* out,
                     ConvWrite mode, bool in_place, Compute& cx) {
  detail::Bf16Weights weights;
  const auto weight_data = pack_bf16_weights(w, weights, cx);
  const int64_t pairs = (g.in_channels + 1) / 2;

  // In place (origin 0, bands of g.band rows), the next band's input is gathered before this
  // band's results overwrite it, so a band must not reach back past the rows of the band
  // before it: g.band >= pad_top (conv2d widens in-place bands to that).
  const int64_t band = g.widest_band();
  const size_t band_words = size_t(pairs * g.band_rows(band) * g.band_width());
  WordBuffer bands[2] = {alloc_aligned<uint32_t>(band_words),
                         in_place ? alloc_aligned<uint32_t>(band_words) : WordBuffer()};

  // Pixels per task: a multiple of 32 that keeps the task's column matrix near
  // kBf16ColumnBytes, then evened out over the band so the last task is not a sliver. Depends
  // on the geometry only, so results do not depend on the thread count.
  const int64_t column_bytes_per_pixel = weights.k_padded * int64_t(sizeof(uint16_t));
  const int64_t widest = std::clamp<int64_t>(kBf16ColumnBytes / column_bytes_per_pixel / 32 * 32,
                                             32, kBf16MaxTilePixels);
  std::vector<WordBuffer> columns(size_t(cx.threads()));  // one per worker, made on first use

  auto fill = [&](int64_t r0, uint32_t* buffer) {
    fill_band_bf16(in, g, r0, g.band_at(r0), buffer, cx);
  };
  int current = 0;
  const int64_t first = g.first_band_row();
  fill(first, bands[0].get());
  for (int64_t r0 = first, rows = 0; r0 < g.need1; r0 += rows) {
    rows = g.band_at(r0);
    const int64_t n = rows * g.out_width, next = r0 + rows;
    if (in_place && next < g.need1) fill(next, bands[1 - current].get());
    const detail::Bf16Band b{bands[current].get(), pairs,    g.band_rows(rows),
                             g.band_width(),       g.kernel, g.stride};
    const int64_t tasks = (n + widest - 1) / widest;
    const int64_t per_task = round_up((n + tasks - 1) / tasks, 32);
    float* band_out = out + r0 * g.out_width;
    cx.pool().for_each_task((n + per_task - 1) / per_task, [&](int64_t t, int worker) {
      WordBuffer& cols = columns[size_t(worker)];
      if (!cols)
        cols = alloc_aligned<uint32_t>(size_t(detail::bf16_columns_size(b, weights, widest)));
      const int64_t p0 = t * per_task;
      detail::bf16_tiles_conv_amx(b, weights, g.out_width, p0, std::min(per_task, n - p0),
                                  cols.get(), band_out, g.out_pixels(),
                                  mode == ConvWrite::Accumulate);
    });
    if (in_place) {
      current = 1 - current;
    } else if (next < g.need1) {
      fill(next, bands[0].get());
    }
  }
}

// Result [Cout, rows·OW] of one band with the BF16 direct kernel, tasks as direct_band's.
void bf16_direct_band(const ConvGeometry& g, const uint32_t* band_input, int64_t rows,
                      const uint32_t* packed, float* result, Compute& cx) {
  const detail::Bf16Band band{
      band_input, (g.in_channels + 1) / 2, g.band_rows(rows), g.band_width(), g.kernel, 1};
  const int64_t segments = (g.out_width + kDirectSegment - 1) / kDirectSegment;
  const int64_t n = rows * g.out_width;
  cx.pool().for_each_task(rows * segments, [&](int64_t t, int) {
    const int64_t oy = t / segments, x0 = t % segments * kDirectSegment;
    const int64_t x1 = std::min(g.out_width, x0 + kDirectSegment);
    detail::direct_conv_row_bf16_avx512(band, packed, g.out_channels, oy, x0, x1,
                                        result + oy * g.out_width, n);
  });
}

#else

void fill_band_bf16(const ConvInput&, const ConvGeometry&, int64_t, int64_t, uint32_t*, Compute&) {
  fail("conv2d: no BF16 kernel in this build");
}

void bf16_direct_band(const ConvGeometry&, const uint32_t*, int64_t, const uint32_t*, float*,
                      Compute&) {
  fail("conv2d: no BF16 direct kernel in this build");
}

void bf16_tiles_conv(const ConvInput&, const ConvGeometry&, const Conv2dWeights&, float*, ConvWrite,
                     bool, Compute&) {
  fail("conv2d: no BF16 tile kernel in this build");
}

#endif

// A 1×1 convolution without padding, striding or transform is a plain GEMM on the input.
bool is_pointwise(const ConvInput& in, const ConvGeometry& g, const Conv2dParams& p) {
  return g.kernel == 1 && g.stride == 1 && g.upsample == 1 && !in.transform && p.pad_top == 0 &&
         p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0;
}

void pointwise_conv(const ConvInput& in, const ConvGeometry& g, const Conv2dWeights& w, float* out,
                    ConvWrite mode, Compute& cx) {
  const int64_t n = g.out_pixels();
  const bool accumulate = mode == ConvWrite::Accumulate;
  Arena::Scope scratch(cx.arena(0));
  const float* packed_w = pack_weights(w, scratch, cx);
  // Tiles of kTileColumns pixels of the full output; this call may start inside one.
  const int64_t lead = (kTileColumns - g.origin_row * g.out_width % kTileColumns) % kTileColumns;
  const int64_t first = std::min(lead, n);
  const int64_t tiles = (first > 0 ? 1 : 0) + (n - first + kTileColumns - 1) / kTileColumns;
  cx.pool().for_each_task(tiles, [&](int64_t t, int worker) {
    const int64_t p0 = first > 0 ? (t == 0 ? 0 : first + (t - 1) * kTileColumns) : t * kTileColumns;
    const int64_t width = first > 0 && t == 0 ? first : std::min(kTileColumns, n - p0);
    conv_gemm(w, packed_w, in.data + p0, width, n, out + p0, n, accumulate, cx, worker);
  });
  if (w.bias.empty()) return;
  cx.pool().parallel_for(g.out_channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t co = c0; co < c1; ++co) {
      float* o = out + co * n;
      const float b = w.bias[size_t(co)];
      for (int64_t i = 0; i < n; ++i) o[i] += b;
    }
  });
}

}  // namespace

// Neither ISA is available on other architectures (quant::isa_available).
bool conv2d_bf16_tiles_available(const Compute& cx) { return cx.amx(); }

bool conv2d_direct_available(const Compute& cx) { return cx.avx512(); }

bool conv2d_bf16_direct_available(const Compute& cx) {
  return cx.avx512() && cpu_features().avx512_bf16;
}

bool conv2d_bf16_direct_available() {
  return conv2d_direct_available() && cpu_features().avx512_bf16;
}

bool conv2d_bf16_tiles_available() { return quant::best_isa() == quant::Isa::Amx; }

bool conv2d_bf16_auto_available() {
  return conv2d_bf16_tiles_available() ||
         (conv2d_bf16_direct_available() && cpu_features().avx512_bf16_fast);
}

bool conv2d_direct_available() {
  const quant::Isa isa = quant::best_isa();
  return isa == quant::Isa::Avx512 || isa == quant::Isa::Amx;
}

Conv2dParams Conv2dParams::same(int64_t kernel) {
  Conv2dParams p;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = kernel / 2;
  return p;
}

int64_t conv2d_band_rows(int64_t out_width) {
  const int64_t rows =
      std::max<int64_t>(1, (kBandPixels + out_width - 1) / std::max<int64_t>(1, out_width));
  return rows >= 4 ? (rows + 3) / 4 * 4 : rows;  // whole rows of Winograd's 4x4 tiles
}

int64_t conv2d_tile_pixels() { return kTileColumns; }

int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_before,
                           int64_t pad_after, int64_t upsample) {
  const int64_t padded = in * upsample + pad_before + pad_after;
  return padded < kernel ? 0 : (padded - kernel) / stride + 1;
}

void conv2d(const ConvInput& in, const Conv2dWeights& w, const Conv2dParams& p, float* out,
            ConvWrite mode, Compute& cx) {
  ConvGeometry g = geometry_of(in, w, p);
  const bool in_place = out == in.data;
  if (in_place) {
    check(g.stride == 1 && g.upsample == 1 && g.out_height == g.in_height &&
              g.out_width == g.in_width && g.out_channels <= g.in_channels,
          "conv2d: in place needs an output of the input's size with no more channels (",
          g.out_channels, "x", g.out_height, "x", g.out_width, " from ", g.in_channels, "x",
          g.in_height, "x", g.in_width, ")");
    check(g.origin_row == 0 && g.need0 == 0 && g.need1 == g.out_height,
          "conv2d: in place works on a whole image (origin row 0, no rows skipped)");
    // A band overwrites input rows the next band reads above its own; the band kept aside
    // holds them only if the band is at least the top padding tall.
    g.band = std::max(g.band, g.pad_top);
  }
  if (use_bf16_tiles(p, cx)) return bf16_tiles_conv(in, g, w, out, mode, in_place, cx);
  if (is_pointwise(in, g, p) && !in_place && p.algorithm != ConvAlgorithm::Bf16Direct &&
      p.algorithm != ConvAlgorithm::Winograd)
    return pointwise_conv(in, g, w, out, mode, cx);

  const int64_t band = g.widest_band();
  const bool winograd = use_winograd(g, p, cx);
  const bool bf16_direct = !winograd && use_bf16_direct(g, p, cx);
  const bool direct = !bf16_direct && !winograd && use_direct(g, p, cx);
  // The call's buffers come from the calling thread's arena: the same memory serves every
  // convolution (and the transformer's temporaries before them), where separate allocations
  // of a few MiB each left the heap fragmented (bench_vae --peak decode 512: 751 MiB peak
  // with them, docs/SPEED.md).
  Arena::Scope scratch(cx.arena(0));
  float* packed = nullptr;
  const float* packed_gemm = nullptr;
  uint32_t* packed_bf16 = nullptr;
  float* band_input = nullptr;
  uint32_t* band_bf16 = nullptr;
  if (bf16_direct) {
    packed_bf16 = scratch.take<uint32_t>(bf16_direct_weights_size(w));
    pack_bf16_direct_weights(w, packed_bf16);
    band_bf16 = scratch.take<uint32_t>(
        size_t((g.in_channels + 1) / 2 * g.band_rows(band) * g.band_width()));
  } else {
    if (winograd) {
      packed = scratch.take<float>(detail::winograd_weights_size(w, cx));
      detail::pack_winograd_weights(w, packed, cx);
    } else if (direct) {
      packed = scratch.take<float>(direct_weights_size(w));
      pack_direct_weights(w, packed);
    } else {
      packed_gemm = pack_weights(w, scratch, cx);
    }
    band_input = scratch.take<float>(size_t(g.in_channels * g.band_rows(band) * g.band_width() +
                                            detail::kWinogradBandSlack));
  }
  float* results[2] = {scratch.take<float>(size_t(g.out_channels * band * g.out_width)),
                       scratch.take<float>(size_t(g.out_channels * band * g.out_width))};

  // Each band's result is written out only after the next band has read its input: in place,
  // the next band still reads the last rows the previous band overwrites.
  int64_t pending_row = -1, pending_rows = 0;
  int current = 0;
  for (int64_t r0 = g.first_band_row(), rows = 0; r0 < g.need1; r0 += rows) {
    rows = g.band_at(r0);
    if (bf16_direct)
      fill_band_bf16(in, g, r0, rows, band_bf16, cx);
    else
      fill_band(in, g, r0, rows, band_input, cx);
    if (pending_row >= 0)
      write_band(results[1 - current], g, w, pending_row, pending_rows, out, mode, cx);
    float* result = results[current];
    if (bf16_direct)
      bf16_direct_band(g, band_bf16, rows, packed_bf16, result, cx);
    else if (winograd)
      detail::winograd_band({band_input, g.in_channels, g.band_rows(rows), g.band_width(), 3},
                            rows, g.out_width, packed, g.out_channels, result,
                            rows * g.out_width, cx);
    else if (direct)
      direct_band(g, band_input, rows, packed, result, cx);
    else
      gemm_band(g, w, packed_gemm, band_input, rows, result, cx);
    pending_row = r0;
    pending_rows = rows;
    current = 1 - current;
  }
  write_band(results[1 - current], g, w, pending_row, pending_rows, out, mode, cx);
}

Tensor conv2d(const Tensor& x, const Conv2dWeights& w, const Conv2dParams& p, Compute& cx,
              const ChannelAffine* transform) {
  check(x.shape().size() == 3, "conv2d: expected a [C, H, W] input, got ", shape_str(x.shape()));
  Tensor y({w.out_channels,
            conv2d_output_size(x.dim(1), w.kernel, p.stride, p.pad_top, p.pad_bottom, p.upsample),
            conv2d_output_size(x.dim(2), w.kernel, p.stride, p.pad_left, p.pad_right, p.upsample)});
  conv2d_into(x, transform, w, p, y, ConvWrite::Overwrite, cx);
  return y;
}

void conv2d_into(const Tensor& x, const ChannelAffine* transform, const Conv2dWeights& w,
                 const Conv2dParams& p, Tensor& y, ConvWrite mode, Compute& cx) {
  check(x.shape().size() == 3, "conv2d: expected a [C, H, W] input, got ", shape_str(x.shape()));
  const Shape expected = {
      w.out_channels,
      conv2d_output_size(x.dim(1), w.kernel, p.stride, p.pad_top, p.pad_bottom, p.upsample),
      conv2d_output_size(x.dim(2), w.kernel, p.stride, p.pad_left, p.pad_right, p.upsample)};
  check(y.shape() == expected, "conv2d: output is ", shape_str(y.shape()), ", expected ",
        shape_str(expected));
  conv2d({x.data(), x.dim(0), x.dim(1), x.dim(2), transform}, w, p, y.data(), mode, cx);
}

}  // namespace klein::ops
