// GGUF Q8_0 blocks are our BlockQ8 byte for byte, and convert deals them into the kernels'
// layout without requantizing (quant::pack_blocks). A GGUF block may hold q = -128, which
// our own quantizer never writes (it uses -127..127): every kernel must still multiply it
// exactly like the scalar reference does.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/threadpool.h"
#include "formats/gguf_types.h"
#include "quant/blocks.h"
#include "quant/matmul.h"
#include "support/isa.h"

namespace klein {
namespace {

using namespace quant;

// N rows of K/32 blocks; every block holds -128 and 127 among random values.
std::vector<BlockQ8> extreme_blocks(int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<BlockQ8> b(size_t(N * K / kBlock));
  for (BlockQ8& blk : b) {
    blk.scale = f32_to_f16(std::uniform_real_distribution<float>(1e-3f, 2e-2f)(rng));
    for (int i = 0; i < kBlock; ++i) blk.q[i] = int8_t(int(rng() % 256) - 128);
    blk.q[rng() % kBlock] = -128;
    blk.q[rng() % kBlock] = 127;
  }
  return b;
}

TEST(GgufQ8, BlocksAreGgmlQ8_0) {
  const std::vector<BlockQ8> b = extreme_blocks(1, 64, 1);
  float ours[64], ggml[64];
  dequantize_q8(b.data(), ours, 64);
  gguf::decode_row(gguf::TensorType::Q8_0, b.data(), ggml, 64);
  EXPECT_EQ(0, std::memcmp(ours, ggml, sizeof ours));
  EXPECT_EQ(sizeof(BlockQ8), gguf::type_info(gguf::TensorType::Q8_0).block_bytes);
}

TEST(GgufQ8, PackedBlocksKeepEveryValue) {
  const int64_t N = 37, K = 96;  // a last group of 5 rows (padded)
  const std::vector<BlockQ8> b = extreme_blocks(N, K, 2);
  for (Layout layout : {Layout::RowMajor, Layout::Interleaved16}) {
    std::vector<uint8_t> packed(storage_bytes(DType::Q8, layout, N, K));
    // In two pieces, as convert slices a tensor.
    pack_blocks(b.data(), 16, K, DType::Q8, layout, packed.data());
    pack_blocks(b.data() + 16 * K / kBlock, N - 16, K, DType::Q8, layout,
                packed.data() + storage_bytes(DType::Q8, layout, 16, K));
    Matrix m{DType::Q8, layout, N, K, packed.data(), packed.size()};
    std::vector<float> got(size_t(N * K)), want(size_t(N * K));
    unpack_rows(m, 0, N, got.data());
    dequantize_q8(b.data(), want.data(), N * K);
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * 4)) << layout_name(layout);
  }
}

// On every instruction set (SKIPPED where this CPU lacks it).
class GgufQ8Kernels : public klein::testing::OnEveryIsa {};

TEST_P(GgufQ8Kernels, MultiplyMinus128) {
  const int64_t M = 40, N = 32, K = 256;
  const std::vector<BlockQ8> b = extreme_blocks(N, K, 3);
  std::vector<uint8_t> packed(storage_bytes(DType::Q8, Layout::Interleaved16, N, K));
  pack_blocks(b.data(), N, K, DType::Q8, Layout::Interleaved16, packed.data());
  const Matrix w{DType::Q8, Layout::Interleaved16, N, K, packed.data(), packed.size()};
  // Activations whose blocks are exact in int8 (integers up to 127 times a power of two), so
  // that the only difference from the reference is float32 summation.
  std::mt19937 rng(4);
  std::vector<float> x(size_t(M * K));
  for (float& v : x) v = float(int(rng() % 255) - 127) / 128.0f;
  for (int64_t m = 0; m < M; ++m)  // every block's max: its int8 scale is 1/128
    for (int64_t blk = 0; blk < K / kBlock; ++blk) x[size_t(m * K + blk * kBlock)] = 127.0f / 128.0f;
  std::vector<float> ref(size_t(M * N));
  matmul_reference(x.data(), M, K, w, ref.data(), N);
  std::vector<float> wf(size_t(N * K));
  unpack_rows(w, 0, N, wf.data());
  ThreadPool pool(1);
  {
    const Isa isa = this->isa();
    std::vector<float> y(size_t(M * N));
    MatmulOptions o;
    o.isa = isa;
    matmul(x.data(), M, K, w, y.data(), N, pool, o);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double mass = 0;
        for (int64_t k = 0; k < K; ++k) mass += std::fabs(double(x[size_t(m * K + k)]) * wf[size_t(n * K + k)]);
        // Saturating or misreading -128 moves a sum by at least 128 * d * |x| ~ 1e-3 * mass;
        // AMX multiplies the weights rounded to bf16 tiles (2^-9 relative).
        const double bound = (isa == Isa::Amx ? 0x1p-8 : 1e-5) * mass + 1e-7;
        ASSERT_NEAR(y[size_t(m * N + n)], ref[size_t(m * N + n)], bound)
            << isa_name(isa) << " row " << m << " col " << n;
      }
  }
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(GgufQ8Kernels);

}  // namespace
}  // namespace klein
