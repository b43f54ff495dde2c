#include "ops/conv2d.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "core/error.h"
#include "ops/blas.h"

namespace klein::ops {

namespace {

// Bytes of the im2col matrix of one band: bounds memory at any image size while keeping the
// GEMM wide (at 1024 columns and 256 input channels that is 3 output rows).
constexpr int64_t kColumnBudgetBytes = int64_t(32) << 20;
// Output columns per GEMM task. A constant, not derived from the thread count, so that every
// output value is computed by the same BLAS call whatever the pool size.
constexpr int64_t kTileColumns = 512;

struct ConvGeometry {
  int64_t in_channels = 0, in_height = 0, in_width = 0;  // as stored
  int64_t height = 0, width = 0;                         // after upsampling
  int64_t out_channels = 0, out_height = 0, out_width = 0;
  int64_t kernel = 1, stride = 1, upsample = 1, pad_top = 0, pad_left = 0;

  int64_t column_rows() const { return in_channels * kernel * kernel; }  // GEMM K
  int64_t out_pixels() const { return out_height * out_width; }
};

ConvGeometry geometry_of(const ConvInput& in, const Conv2dWeights& w, const Conv2dParams& p) {
  check(w.kernel >= 1 && w.out_channels >= 1 && w.in_channels >= 1,
        "conv2d: invalid weights [", w.out_channels, ", ", w.in_channels, ", ", w.kernel, ", ",
        w.kernel, "]");
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
  g.out_height = conv2d_output_size(in.height, w.kernel, p.stride, p.pad_top, p.pad_bottom,
                                    p.upsample);
  g.out_width = conv2d_output_size(in.width, w.kernel, p.stride, p.pad_left, p.pad_right,
                                   p.upsample);
  g.kernel = w.kernel;
  g.stride = p.stride;
  g.upsample = p.upsample;
  g.pad_top = p.pad_top;
  g.pad_left = p.pad_left;
  check(g.out_height >= 1 && g.out_width >= 1, "conv2d: a ", in.height, "x", in.width,
        " input is too small for a ", w.kernel, "x", w.kernel, " kernel");
  check(g.column_rows() < INT_MAX && g.out_pixels() < INT_MAX && in.height * in.width < INT_MAX,
        "conv2d: ", in.height, "x", in.width, "x", in.channels, " input is too large");
  return g;
}

// For kernel column kx and output column ox: the stored input column read, or -1 (padding).
std::vector<int64_t> source_columns(const ConvGeometry& g) {
  std::vector<int64_t> src(size_t(g.kernel * g.out_width));
  for (int64_t kx = 0; kx < g.kernel; ++kx)
    for (int64_t ox = 0; ox < g.out_width; ++ox) {
      const int64_t x = ox * g.stride - g.pad_left + kx;
      src[size_t(kx * g.out_width + ox)] = (x >= 0 && x < g.width) ? x / g.upsample : -1;
    }
  return src;
}

// Scratch for the transformed input rows of one channel and one band.
int64_t band_source_rows(const ConvGeometry& g, int64_t band_rows) {
  return ((band_rows - 1) * g.stride + g.kernel) / g.upsample + 2;
}

// One output row's worth of one column-matrix row: the input row `src` (stored columns)
// as seen through kernel column kx.
void gather_row(const ConvGeometry& g, const float* src, int64_t kx, const int64_t* src_x,
                float* dst) {
  const int64_t ow = g.out_width;
  if (g.stride == 1 && g.upsample == 1) {
    // Output column ox reads input column ox - pad_left + kx: one contiguous run.
    const int64_t shift = kx - g.pad_left;
    const int64_t begin = std::clamp<int64_t>(-shift, 0, ow);
    const int64_t end = std::clamp<int64_t>(g.width - shift, begin, ow);
    std::fill(dst, dst + begin, 0.0f);
    std::memcpy(dst + begin, src + begin + shift, size_t(end - begin) * sizeof(float));
    std::fill(dst + end, dst + ow, 0.0f);
    return;
  }
  for (int64_t ox = 0; ox < ow; ++ox) dst[ox] = src_x[ox] >= 0 ? src[src_x[ox]] : 0.0f;
}

// columns [K, rows·OW] for output rows [r0, r0 + rows): row (ci·k + ky)·k + kx holds the input
// value that each output pixel multiplies with weight [·, ci, ky, kx].
void gather_columns(const ConvInput& in, const ConvGeometry& g, const std::vector<int64_t>& src_x,
                    int64_t r0, int64_t rows, float* columns,
                    std::vector<std::vector<float>>& scratch, ThreadPool& pool) {
  const int64_t n = rows * g.out_width;
  const int64_t k = g.kernel;
  // Virtual (upsampled) input rows the band reads, clipped to the image.
  const int64_t first = std::max<int64_t>(0, r0 * g.stride - g.pad_top);
  const int64_t last = std::min(g.height - 1, (r0 + rows - 1) * g.stride - g.pad_top + k - 1);
  const int64_t src_first = first / g.upsample;
  const int64_t src_rows = last >= first ? last / g.upsample - src_first + 1 : 0;
  pool.parallel_for(g.in_channels, [&](int64_t c0, int64_t c1, int worker) {
    for (int64_t ci = c0; ci < c1; ++ci) {
      // The stored rows of this band, transformed once here rather than k² times below.
      const float* band = in.data + (ci * g.in_height + src_first) * g.in_width;
      if (in.transform && src_rows > 0) {
        float* buf = scratch[size_t(worker)].data();
        in.transform->apply(ci, band, buf, src_rows * g.in_width);
        band = buf;
      }
      for (int64_t ky = 0; ky < k; ++ky)
        for (int64_t kx = 0; kx < k; ++kx) {
          float* dst = columns + ((ci * k + ky) * k + kx) * n;
          for (int64_t oy = 0; oy < rows; ++oy, dst += g.out_width) {
            const int64_t y = (r0 + oy) * g.stride - g.pad_top + ky;
            if (y < 0 || y >= g.height) {
              std::fill(dst, dst + g.out_width, 0.0f);
              continue;
            }
            const float* src = band + (y / g.upsample - src_first) * g.in_width;
            gather_row(g, src, kx, src_x.data() + kx * g.out_width, dst);
          }
        }
    }
  });
}

// out [Cout, n] (row stride ldc) = W [Cout, K] · b [K, n] (row stride ldb) + beta · out,
// one single-threaded BLAS call per tile of kTileColumns columns.
void multiply(const Conv2dWeights& w, const float* b, int64_t n, int64_t ldb, float* out,
              int64_t ldc, float beta, ThreadPool& pool) {
  const int64_t K = w.in_channels * w.kernel * w.kernel;
  const int64_t tiles = (n + kTileColumns - 1) / kTileColumns;
  pool.for_each_task(tiles, [&](int64_t t, int) {
    const int64_t n0 = t * kTileColumns;
    const int64_t cols = std::min(kTileColumns, n - n0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(w.out_channels), int(cols), int(K),
                1.0f, w.weight.data(), int(K), b + n0, int(ldb), beta, out + n0, int(ldc));
  });
}

// Rows [r0, r0 + rows) of every output channel from a band result [Cout, rows·OW].
void write_band(const float* result, const ConvGeometry& g, const Conv2dWeights& w, int64_t r0,
                int64_t rows, float* out, ConvWrite mode, ThreadPool& pool) {
  const int64_t n = rows * g.out_width;
  pool.parallel_for(g.out_channels, [&](int64_t c0, int64_t c1, int) {
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

// A 1×1 convolution without padding, striding or transform is a plain GEMM on the input.
bool is_pointwise(const ConvInput& in, const ConvGeometry& g, const Conv2dParams& p) {
  return g.kernel == 1 && g.stride == 1 && g.upsample == 1 && !in.transform && p.pad_top == 0 &&
         p.pad_bottom == 0 && p.pad_left == 0 && p.pad_right == 0;
}

void pointwise_conv(const ConvInput& in, const ConvGeometry& g, const Conv2dWeights& w,
                    float* out, ConvWrite mode, ThreadPool& pool) {
  const int64_t n = g.out_pixels();
  const float beta = mode == ConvWrite::Accumulate ? 1.0f : 0.0f;
  multiply(w, in.data, n, n, out, n, beta, pool);
  if (w.bias.empty()) return;
  pool.parallel_for(g.out_channels, [&](int64_t c0, int64_t c1, int) {
    for (int64_t co = c0; co < c1; ++co) {
      float* o = out + co * n;
      const float b = w.bias[size_t(co)];
      for (int64_t i = 0; i < n; ++i) o[i] += b;
    }
  });
}

}  // namespace

Conv2dParams Conv2dParams::same(int64_t kernel) {
  Conv2dParams p;
  p.pad_top = p.pad_bottom = p.pad_left = p.pad_right = kernel / 2;
  return p;
}

int64_t conv2d_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad_before,
                           int64_t pad_after, int64_t upsample) {
  const int64_t padded = in * upsample + pad_before + pad_after;
  return padded < kernel ? 0 : (padded - kernel) / stride + 1;
}

void conv2d(const ConvInput& in, const Conv2dWeights& w, const Conv2dParams& p, float* out,
            ConvWrite mode, ThreadPool& pool) {
  const ConvGeometry g = geometry_of(in, w, p);
  ensure_blas_single_threaded();
  const bool in_place = out == in.data;
  if (is_pointwise(in, g, p) && !in_place) return pointwise_conv(in, g, w, out, mode, pool);

  const int64_t K = g.column_rows();
  int64_t band = std::clamp<int64_t>(kColumnBudgetBytes / int64_t(sizeof(float)) /
                                         (K * g.out_width), 1, g.out_height);
  if (in_place) {
    check(g.stride == 1 && g.upsample == 1 && g.out_height == g.in_height &&
              g.out_width == g.in_width && g.out_channels <= g.in_channels,
          "conv2d: in place needs an output of the input's size with no more channels (", 
          g.out_channels, "x", g.out_height, "x", g.out_width, " from ", g.in_channels, "x",
          g.in_height, "x", g.in_width, ")");
    // A band must not reach back past the rows of the band before it.
    band = std::max(band, g.pad_top);
  }

  const std::vector<int64_t> src_x = source_columns(g);
  auto columns = alloc_aligned<float>(size_t(K * band * g.out_width));
  std::unique_ptr<float[], FreeAligned> results[2] = {
      alloc_aligned<float>(size_t(g.out_channels * band * g.out_width)),
      alloc_aligned<float>(size_t(g.out_channels * band * g.out_width))};
  std::vector<std::vector<float>> scratch;
  if (in.transform)
    scratch.assign(size_t(pool.size()),
                   std::vector<float>(size_t(band_source_rows(g, band) * g.in_width)));

  // Each band's result is written out only after the next band has gathered its input: in
  // place, the next band still reads the last rows the previous band overwrites.
  int64_t pending_row = -1, pending_rows = 0;
  int current = 0;
  for (int64_t r0 = 0; r0 < g.out_height; r0 += band) {
    const int64_t rows = std::min(band, g.out_height - r0);
    gather_columns(in, g, src_x, r0, rows, columns.get(), scratch, pool);
    if (pending_row >= 0)
      write_band(results[1 - current].get(), g, w, pending_row, pending_rows, out, mode, pool);
    multiply(w, columns.get(), rows * g.out_width, rows * g.out_width, results[current].get(),
             rows * g.out_width, 0.0f, pool);
    pending_row = r0;
    pending_rows = rows;
    current = 1 - current;
  }
  write_band(results[1 - current].get(), g, w, pending_row, pending_rows, out, mode, pool);
}

Tensor conv2d(const Tensor& x, const Conv2dWeights& w, const Conv2dParams& p, ThreadPool& pool,
              const ChannelAffine* transform) {
  check(x.shape().size() == 3, "conv2d: expected a [C, H, W] input, got ", shape_str(x.shape()));
  Tensor y({w.out_channels,
            conv2d_output_size(x.dim(1), w.kernel, p.stride, p.pad_top, p.pad_bottom, p.upsample),
            conv2d_output_size(x.dim(2), w.kernel, p.stride, p.pad_left, p.pad_right,
                               p.upsample)});
  conv2d_into(x, transform, w, p, y, ConvWrite::Overwrite, pool);
  return y;
}

void conv2d_into(const Tensor& x, const ChannelAffine* transform, const Conv2dWeights& w,
                 const Conv2dParams& p, Tensor& y, ConvWrite mode, ThreadPool& pool) {
  check(x.shape().size() == 3, "conv2d: expected a [C, H, W] input, got ", shape_str(x.shape()));
  const Shape expected = {
      w.out_channels,
      conv2d_output_size(x.dim(1), w.kernel, p.stride, p.pad_top, p.pad_bottom, p.upsample),
      conv2d_output_size(x.dim(2), w.kernel, p.stride, p.pad_left, p.pad_right, p.upsample)};
  check(y.shape() == expected, "conv2d: output is ", shape_str(y.shape()), ", expected ",
        shape_str(expected));
  conv2d({x.data(), x.dim(0), x.dim(1), x.dim(2), transform}, w, p, y.data(), mode, pool);
}

}  // namespace klein::ops
