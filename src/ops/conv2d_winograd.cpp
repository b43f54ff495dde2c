#include "ops/conv2d_winograd.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm.h"
#include "ops/winograd_kernels.h"

namespace klein::ops::detail {

namespace {

// The portable transforms: "vectors" of 4 floats, tiles in order.
struct ScalarWinogradVec {
  struct Reg {
    float v[4];
  };
  static Reg load(const float* p) { return {{p[0], p[1], p[2], p[3]}}; }
  static void store(float* p, Reg r) { std::memcpy(p, r.v, sizeof r.v); }
  static Reg add(Reg a, Reg b) {
    for (int l = 0; l < 4; ++l) a.v[l] += b.v[l];
    return a;
  }
  static Reg sub(Reg a, Reg b) {
    for (int l = 0; l < 4; ++l) a.v[l] -= b.v[l];
    return a;
  }
  static Reg mul(Reg a, Reg b) {
    for (int l = 0; l < 4; ++l) a.v[l] *= b.v[l];
    return a;
  }
  static Reg fma(Reg a, Reg b, Reg c) {
    for (int l = 0; l < 4; ++l) c.v[l] += a.v[l] * b.v[l];
    return c;
  }
  static Reg set(float x) { return {{x, x, x, x}}; }
  static void load4(const float* p, Reg r[4]) {
    for (int e = 0; e < 4; ++e)
      for (int l = 0; l < 4; ++l) r[e].v[l] = p[4 * l + e];
  }
  static void store4(float* p, const Reg r[4]) {
    for (int e = 0; e < 4; ++e)
      for (int l = 0; l < 4; ++l) p[4 * l + e] = r[e].v[l];
  }
};

}  // namespace

WinogradKernels winograd_kernels_scalar() { return Winograd<ScalarWinogradVec>::kernels(); }

namespace {

WinogradKernels kernels_for(quant::Isa isa) {
  switch (isa) {
#if defined(KLEIN_X86)
    case quant::Isa::Avx512:
    case quant::Isa::Amx: return winograd_kernels_avx512();
    case quant::Isa::Avx2: return winograd_kernels_avx2();
#endif
#if defined(KLEIN_ARM64)
    case quant::Isa::Neon: return winograd_kernels_neon();
#endif
    default: return winograd_kernels_scalar();
  }
}

// The transforms for a row of `tiles` tiles: on AVX-512, the AVX2 ones (8 lanes) where 16
// would compute more padding tiles (a 32-pixel-wide layer has 8 tiles a row: half of each
// AVX-512 group and of its GEMM columns would be padding).
WinogradKernels kernels_for(quant::Isa isa, int64_t tiles) {
#if defined(KLEIN_X86)
  if ((isa == quant::Isa::Avx512 || isa == quant::Isa::Amx) &&
      round_up(tiles, 16) > round_up(tiles, 8))
    return winograd_kernels_avx2();
#endif
  return kernels_for(isa);
}

// The transformed input and output of one chunk of tile rows stay near this many floats
// together (8 MiB), whatever the image size.
constexpr int64_t kChunkFloats = int64_t(2) << 20;
// Columns (tiles) per GEMM task.
constexpr int64_t kGemmColumns = 256;
// GEMM tasks a chunk should give each thread at least: where its 36 points times the column
// tasks are fewer, the output channels are split too. (A chunk has about 8 MiB of points, so
// at every layer of the VAE it has fewer than 256 tiles: 36 tasks, which 16 threads would
// take in three rounds with a quarter of the last ones idle.)
constexpr int64_t kTasksPerThread = 6;

}  // namespace

size_t winograd_weights_size(const Conv2dWeights& w, const Compute& cx) {
  return kWinogradPoints * gemm_packed_a_floats(w.out_channels, w.in_channels, cx.isa());
}

void pack_winograd_weights(const Conv2dWeights& w, float* packed, Compute& cx) {
  check(w.kernel == 3, "conv2d: the Winograd transform is for 3x3 kernels, not ", w.kernel, "x",
        w.kernel);
  const WinogradKernels k = kernels_for(cx.isa());
  const int64_t C = w.in_channels, Cout = w.out_channels, Cp = round_up(C, k.lanes);
  const int64_t mr = gemm_row_block(cx.isa());
  const size_t point = gemm_packed_a_floats(Cout, C, cx.isa());
  // One task per block of mr output channels: their 36 matrices of [mr, C] (rows Cp apart),
  // then packed. Each output channel's kernels are first laid out tap by tap.
  cx.pool().parallel_for((Cout + mr - 1) / mr, [&](int64_t b0, int64_t b1, int worker) {
    Arena::Scope scratch(cx.arena(worker));
    float* u = scratch.take<float>(size_t(kWinogradPoints * mr * Cp));
    float* taps = scratch.take<float>(size_t(9 * Cp));
    std::fill(taps, taps + 9 * Cp, 0.0f);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t i0 = b * mr, count = std::min(mr, Cout - i0);
      for (int64_t r = 0; r < count; ++r) {
        const float* g = w.weight.data() + (i0 + r) * C * 9;
        for (int64_t c = 0; c < C; ++c)
          for (int t = 0; t < 9; ++t) taps[t * Cp + c] = g[c * 9 + t];
        k.weights(taps, Cp, u + r * Cp, mr * Cp);
      }
      for (int64_t x = 0; x < kWinogradPoints; ++x)
        gemm_pack_a_rows(u + x * mr * Cp, Cp, i0, count, Cout, C, cx.isa(), packed + x * point);
    }
  });
}

void winograd_band(const DirectBand& band, int64_t rows, int64_t out_width, const float* packed,
                   int64_t out_channels, float* result, int64_t ld, Compute& cx) {
  check(band.kernel == 3 && band.rows == rows + 2 && band.width == out_width + 2,
        "conv2d: a Winograd band of ", band.rows, "x", band.width, " for ", rows, "x", out_width,
        " outputs");
  const WinogradKernels k = kernels_for(cx.isa(), (out_width + 3) / 4);
  const int64_t W = k.lanes, C = band.channels, Cout = out_channels, bw = band.width;
  constexpr int64_t kMaxLanes = 16;  // the stack buffers below hold groups of up to 16 tiles
  check(W <= kMaxLanes, "internal: Winograd groups of ", W, " tiles, at most ", kMaxLanes);
  const int64_t tile_rows = (rows + 3) / 4;
  const int64_t row_tiles = round_up((out_width + 3) / 4, W);  // a row of tiles, whole groups
  const int64_t groups = row_tiles / W;
  const int64_t chunk_rows = std::clamp<int64_t>(
      kChunkFloats / (kWinogradPoints * (C + Cout) * row_tiles), 1, tile_rows);
  const int64_t chunk_tiles = chunk_rows * row_tiles;
  const size_t point = gemm_packed_a_floats(Cout, C, cx.isa());
  // Output channels per GEMM task: all of them, or fewer (whole blocks of the kernel's rows)
  // where the chunks' column tasks leave under kTasksPerThread tasks a thread.
  const int64_t mr = gemm_row_block(cx.isa()), row_blocks = (Cout + mr - 1) / mr;
  const int64_t column_tasks = kWinogradPoints * ((chunk_tiles + kGemmColumns - 1) / kGemmColumns);
  const int64_t wanted = kTasksPerThread * cx.threads();
  const int64_t row_splits = std::clamp<int64_t>((wanted + column_tasks - 1) / column_tasks, 1,
                                                 row_blocks);
  const int64_t rows_per_task = (row_blocks + row_splits - 1) / row_splits * mr;

  Arena::Scope scratch(cx.arena(0));
  float* v = scratch.take<float>(size_t(kWinogradPoints * C * chunk_tiles));
  float* m = scratch.take<float>(size_t(kWinogradPoints * Cout * chunk_tiles));
  const int64_t group_floats = 4 * W + 4;  // what a group reads of a row
  float* zeros = scratch.take<float>(size_t(group_floats));
  std::fill(zeros, zeros + group_floats, 0.0f);

  for (int64_t ty0 = 0; ty0 < tile_rows; ty0 += chunk_rows) {
    const int64_t nty = std::min(chunk_rows, tile_rows - ty0), n = nty * row_tiles;
    // V[ξ][c][tile]: every input channel of every tile row of the chunk.
    cx.pool().parallel_for(C * nty, [&](int64_t i0, int64_t i1, int) {
      float copy[6 * (4 * kMaxLanes + 4)];  // rows of a group that ends past the band
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t c = i / nty, ty = ty0 + i % nty;
        const float* row[6];
        for (int r = 0; r < 6; ++r) {
          const int64_t y = 4 * ty + r;
          row[r] = y < band.rows ? band.data + (c * band.rows + y) * bw : nullptr;
        }
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t x0 = 4 * g * W;
          const bool inside = x0 + 4 * W + 2 <= bw;
          const float* at[6];
          for (int r = 0; r < 6; ++r) {
            if (!row[r]) {
              at[r] = zeros;
            } else if (inside) {
              at[r] = row[r] + x0;
            } else {
              float* dst = copy + r * group_floats;
              const int64_t have = std::max<int64_t>(0, std::min(group_floats, bw - x0));
              std::memcpy(dst, row[r] + x0, size_t(have) * sizeof(float));
              std::fill(dst + have, dst + group_floats, 0.0f);
              at[r] = dst;
            }
          }
          k.input(at, v + c * n + (ty - ty0) * row_tiles + g * W, C * n);
        }
      }
    });
    // M[ξ] = U[ξ] · V[ξ]: [Cout, n] for each point, in tasks of kGemmColumns tiles and
    // rows_per_task output channels.
    const int64_t splits = (n + kGemmColumns - 1) / kGemmColumns;
    const int64_t row_tasks = (Cout + rows_per_task - 1) / rows_per_task;
    const int64_t per_point = splits * row_tasks;
    cx.pool().for_each_task(kWinogradPoints * per_point, [&](int64_t t, int worker) {
      const int64_t x = t / per_point, j0 = t % per_point / row_tasks * kGemmColumns;
      const int64_t i0 = t % row_tasks * rows_per_task;
      Arena::Scope pack(cx.arena(worker));
      gemm({.M = std::min(rows_per_task, Cout - i0), .N = std::min(kGemmColumns, n - j0), .K = C,
            .b = v + x * C * n + j0, .ldb = n, .c = m + (x * Cout + i0) * n + j0, .ldc = n,
            .a_packed = packed + x * point, .a_packed_row0 = i0, .a_packed_rows = Cout},
           cx.isa(), pack.take<float>(gemm_pack_floats()));
    });
    // Y = Aᵀ M A into the result rows; tiles past the band's rows or columns are dropped.
    cx.pool().parallel_for(Cout * nty, [&](int64_t i0, int64_t i1, int) {
      float spill[4 * 4 * kMaxLanes];
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t co = i / nty, ty = ty0 + i % nty;
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t x0 = 4 * g * W;
          const bool whole = 4 * ty + 3 < rows && x0 + 4 * W <= out_width;
          float* out[4];
          for (int r = 0; r < 4; ++r)
            out[r] = whole ? result + co * ld + (4 * ty + r) * out_width + x0 : spill + r * 4 * W;
          k.output(m + co * n + (ty - ty0) * row_tiles + g * W, Cout * n, out);
          if (whole) continue;
          const int64_t width = std::min(4 * W, out_width - x0);
          for (int r = 0; r < 4 && 4 * ty + r < rows; ++r)
            std::memcpy(result + co * ld + (4 * ty + r) * out_width + x0, spill + r * 4 * W,
                        size_t(width) * sizeof(float));
        }
      }
    });
  }
}

}  // namespace klein::ops::detail
