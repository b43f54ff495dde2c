// The AVX-VNNI tiles (quant/kernels_avxvnni.cpp) against the AVX2 tiles they stand in for: the
// integer sums are exact either way and the float work after each block is the same, so every
// output must be the same float, bit for bit, for Q8 and Q4, every row count up to each
// kernel's tile, partial column groups, several blocks and accumulation into Y. Skipped where
// the CPU has no AVX-VNNI (or KLEIN_ISA=avx2 hides it).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/cpu.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/matmul.h"
#include "quant_testing.h"
#include "support/isa.h"

namespace klein::quant {
namespace {

using testing::Dist;
using testing::Packed;
using testing::random_matrix;

#if defined(KLEIN_X86)

// Y = X·Wᵀ through one kernel table alone, the way matmul drives it (one thread): activations
// quantized in the kernel's tile layout, then every 16-column group and row tile, K in two
// chunks so that the second adds into Y.
std::vector<float> run(const detail::Kernels& k, const std::vector<float>& x, int64_t M,
                       const Matrix& w) {
  const int64_t N = w.rows, K = w.cols, nb = K / kBlock, mr = k.int_rows;
  const size_t entries = size_t((M + mr - 1) / mr * mr * nb);
  std::vector<int8_t> q(entries * kBlock);
  std::vector<float> scale(entries), scaled(entries);
  std::vector<int32_t> bias(entries);
  detail::ActBlocks act{q.data(), scale.data(), scaled.data(), bias.data(), nb, int(mr)};
  k.quantize_rows(x.data(), K, 0, M, K, act);
  std::vector<float> y(size_t(M * N), -1.0f);
  const int64_t half = nb / 2;
  for (int64_t g = 0; g * kTileRows < N; ++g) {
    const int cols = int(std::min<int64_t>(kTileRows, N - g * kTileRows));
    for (int64_t m = 0; m < M; m += mr) {
      const int rows = int(std::min<int64_t>(mr, M - m));
      float* yt = y.data() + m * N + g * kTileRows;
      for (const auto& [b0, count] : {std::pair{int64_t(0), half}, std::pair{half, nb - half}}) {
        if (w.type == DType::Q8) {
          const auto* t = static_cast<const TileQ8*>(w.data) + g * nb + b0;
          k.tiles_q8(act, m, b0, rows, t, count, yt, N, cols, b0 > 0);
        } else {
          const auto* t = static_cast<const TileQ4*>(w.data) + g * nb + b0;
          k.tiles_q4(act, m, b0, rows, t, count, yt, N, cols, b0 > 0);
        }
      }
    }
  }
  return y;
}

TEST(AvxVnni, TilesAreTheAvx2TilesBitForBit) {
  KLEIN_REQUIRE_PATH(cpu_features().avx_vnni, "avx-vnni",
                     "the CPU has no AVX-VNNI (or KLEIN_ISA hides it): " +
                         describe(cpu_features()));
  const detail::Kernels vnni = detail::avx_vnni_kernels(detail::avx2_pair_kernels().quantize_rows);
  EXPECT_EQ(detail::avx2_kernels().tiles_q4, vnni.tiles_q4);  // what matmul picks here
  const int64_t K = 256;
  for (DType type : {DType::Q8, DType::Q4}) {
    for (int64_t N : {16, 40}) {  // whole groups; a group of 8 columns at the end
      const std::vector<float> wf = random_matrix(N, K, uint32_t(N + int(type)), Dist::Outliers);
      Packed w(wf.data(), N, K, type, Layout::Interleaved16);
      for (int64_t M : {1, 3, 4, 5, 6, 7, 13}) {  // within and across both kernels' tiles
        const std::vector<float> x = random_matrix(M, K, uint32_t(M * 7 + N), Dist::Gauss);
        const std::vector<float> pair = run(detail::avx2_pair_kernels(), x, M, w.matrix);
        const std::vector<float> got = run(vnni, x, M, w.matrix);
        ASSERT_EQ(got.size(), pair.size());
        EXPECT_EQ(0, std::memcmp(got.data(), pair.data(), got.size() * sizeof(float)))
            << dtype_name(type) << " M=" << M << " N=" << N;
        for (float v : got) ASSERT_NE(v, -1.0f) << "an output was not written";
      }
    }
  }
}

#endif

}  // namespace
}  // namespace klein::quant
