// matmul on every instruction set against the scalar reference, with the error bounds stated
// in quant/matmul.h checked per output element.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "core/threadpool.h"
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

constexpr double kU = 1.0 / (1 << 24);  // float32 unit roundoff

struct Shape {
  int64_t M, N, K;
};

std::string describe(DType type, Layout layout, Isa isa, Shape s) {
  std::ostringstream o;
  o << dtype_name(type) << " " << layout_name(layout) << " " << isa_name(isa) << " M=" << s.M
    << " N=" << s.N << " K=" << s.K;
  return o.str();
}

// Per-output error bounds of quant/matmul.h, computed from the data.
class Bounds {
 public:
  // wf: the dequantized weights.
  Bounds(const std::vector<float>& x, int64_t ldx, const Packed& w, const std::vector<float>& wf,
         int64_t M)
      : M_(M), N_(w.matrix.rows), K_(w.matrix.cols), type_(w.matrix.type) {
    const int64_t nb = K_ / kBlock;
    magnitude_.assign(size_t(M_ * N_), 0.0);
    activation_.assign(size_t(M_ * N_), 0.0);
    rounding_.assign(size_t(M_ * N_), 0.0);
    for (int64_t m = 0; m < M_; ++m) {
      for (int64_t n = 0; n < N_; ++n) {
        double p = 0, a = 0, r = 0;
        for (int64_t b = 0; b < nb; ++b) {
          double amax = 0, wsum = 0, pb = 0;
          for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
            const double xv = x[size_t(m * ldx + k)], wv = wf[size_t(n * K_ + k)];
            amax = std::max(amax, std::fabs(xv));
            wsum += std::fabs(wv);
            pb += std::fabs(xv * wv);
          }
          p += pb;
          a += amax / 254 * wsum;
          r += amax * 1.01 * wsum;
        }
        magnitude_[size_t(m * N_ + n)] = p;
        activation_[size_t(m * N_ + n)] = a;
        rounding_[size_t(m * N_ + n)] = r * double(nb + 4) * 2 * kU;
      }
    }
  }

  // Q4 splits each block sum into d * sum(q x) - d * z * sum(x); those two terms can be larger
  // than the block's contribution, so their rounding is bounded with the block scales.
  void set_q4_scales(const std::vector<float>& d, const std::vector<float>& x, int64_t ldx) {
    const int64_t nb = K_ / kBlock;
    for (int64_t m = 0; m < M_; ++m) {
      for (int64_t n = 0; n < N_; ++n) {
        double r = 0;
        for (int64_t b = 0; b < nb; ++b) {
          double amax = 0;
          for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k)
            amax = std::max(amax, double(std::fabs(x[size_t(m * ldx + k)])));
          r += amax * 1.01 * kBlock * 31 * d[size_t(n * nb + b)];
        }
        rounding_[size_t(m * N_ + n)] = std::max(rounding_[size_t(m * N_ + n)],
                                                 r * double(nb + 4) * 2 * kU);
      }
    }
  }

  // Against the float32-activation reference; `exact`: float32 activations throughout.
  double to_reference(int64_t m, int64_t n, bool exact) const {
    const size_t i = size_t(m * N_ + n);
    if (!exact) return activation_[i] + rounding_[i] + 2 * kU * magnitude_[i] + 1e-30;
    return double(K_ + 16) * kU * magnitude_[i] + 2 * kU * magnitude_[i] + 1e-30;
  }
  // Q8 / Q4 on AMX tiles: activations and dequantized weights each rounded to bf16 (relative
  // error 2^-9 each), products and sums in float32.
  double bf16_tiles(int64_t m, int64_t n) const {
    const size_t i = size_t(m * N_ + n);
    return (1.0 / 256 + 1.0 / (1 << 17) + double(K_ + 20) * kU) * magnitude_[i] + 1e-30;
  }
  // BF16 weights on AMX tiles with the activations in three bf16 parts: float32 inputs, three
  // float32 additions per product.
  double split_tiles(int64_t m, int64_t n) const {
    const size_t i = size_t(m * N_ + n);
    return double(3 * K_ + 20) * kU * 1.01 * magnitude_[i] + 1e-30;
  }
  // Between two paths that quantize activations identically (integer sums are exact).
  double between_paths(int64_t m, int64_t n) const {
    const size_t i = size_t(m * N_ + n);
    return 2 * rounding_[i] + 4 * kU * magnitude_[i] + 1e-30;
  }

 private:
  int64_t M_, N_, K_;
  DType type_;
  std::vector<double> magnitude_, activation_, rounding_;
};

std::vector<float> q4_block_scales(const std::vector<float>& w, int64_t N, int64_t K) {
  std::vector<BlockQ4> blocks(size_t(N * K / kBlock));
  quantize_q4(w.data(), blocks.data(), N * K);
  std::vector<float> d(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) d[i] = q4_scale(blocks[i].scale);
  return d;
}

struct Case {
  Shape shape;
  Dist x_dist = Dist::Gauss;
  Dist w_dist = Dist::Gauss;
  float x_scale = 1.0f, w_scale = 1.0f;
  int64_t x_pad = 0, y_pad = 0;  // extra row stride
  bool per_panel_x = false;       // AMX wide plan: X converted per panel (amx_shared_x_bytes 0)
};

// Runs one case on every available instruction set, for every weight format, and checks each
// output against the reference bound and (for the quantized types) against the scalar path.
// Run on `isa` (and, for the comparison, on the scalar path).
void check_case(const Case& c, ThreadPool& pool, Isa on) {
  const auto [M, N, K] = c.shape;
  const int64_t ldx = K + c.x_pad, ldy = N + c.y_pad;
  const std::vector<float> x = random_matrix(M, ldx, uint32_t(M * 7 + N * 3 + K), c.x_dist, c.x_scale);
  const std::vector<float> w = random_matrix(N, K, uint32_t(M + N * 5 + K * 11), c.w_dist, c.w_scale);
  for (auto [type, layout] : testing::all_formats()) {
    const Packed p(w.data(), N, K, type, layout);
    std::vector<float> wf(size_t(N * K));
    unpack_rows(p.matrix, 0, N, wf.data());
    Bounds bounds(x, ldx, p, wf, M);
    if (type == DType::Q4) bounds.set_q4_scales(q4_block_scales(w, N, K), x, ldx);
    const float sentinel = -12345.0f;
    std::vector<float> ref(size_t(M * ldy), sentinel);
    matmul_reference(x.data(), M, ldx, p.matrix, ref.data(), ldy);
    const bool quantized = type == DType::Q8 || type == DType::Q4;
    // Quantized types: int8 / bf16-tile activations on every instruction set. Float types
    // only where they run on AMX tiles (BF16 in three exact parts, then any type under
    // float_on_tiles); elsewhere ops::linear multiplies them with OpenBLAS (tests/ops).
    for (bool float_tiles : {false, true}) {
      if (quantized && float_tiles) continue;
      std::vector<float> scalar;
      const std::vector<Isa> isas =
          on == Isa::Scalar ? std::vector<Isa>{on} : std::vector<Isa>{Isa::Scalar, on};
      for (Isa isa : isas) {
        std::vector<float> y(size_t(M * ldy), sentinel);
        MatmulOptions options;
        options.isa = isa;
        options.float_on_tiles = float_tiles;
        if (c.per_panel_x) options.amx_shared_x_bytes = 0;
        if (!quantized && !runs_on_tiles(p.matrix, M, options)) {
          EXPECT_THROW(matmul(x.data(), M, ldx, p.matrix, y.data(), ldy, pool, options), Error);
          continue;
        }
        matmul(x.data(), M, ldx, p.matrix, y.data(), ldy, pool, options);
        const std::string what = describe(type, layout, isa, c.shape) +
                                 (float_tiles ? " float_on_tiles" : "");
        int failures = 0;
        for (int64_t m = 0; m < M && failures < 5; ++m) {
          for (int64_t n = 0; n < ldy && failures < 5; ++n) {
            const double got = y[size_t(m * ldy + n)];
            if (n >= N) {  // padding between rows must be left alone
              if (got != sentinel) ++failures;
              EXPECT_EQ(got, sentinel) << what << " wrote padding";
              continue;
            }
            const double err = std::fabs(got - ref[size_t(m * ldy + n)]);
            // AMX rounds to bf16 instead of int8 blocks, from kAmxMinRows rows on.
            const bool tiles = isa == Isa::Amx && (quantized || float_tiles) &&
                               M >= detail::kAmxMinRows;
            // BF16 weights on AMX without float_on_tiles: exact activations in three parts.
            const bool split = isa == Isa::Amx && type == DType::BF16 && !float_tiles &&
                               M >= detail::kAmxMinRows;
            const double bound = tiles   ? bounds.bf16_tiles(m, n)
                                 : split ? bounds.split_tiles(m, n)
                                         : bounds.to_reference(m, n, !quantized);
            if (!(err <= bound)) {
              ++failures;
              ADD_FAILURE() << what << " y[" << m << ", " << n << "] = " << got << ", reference "
                            << ref[size_t(m * ldy + n)] << ", error " << err << " > bound "
                            << bound;
            }
            if (!scalar.empty() && quantized && !tiles) {
              const double d = std::fabs(got - scalar[size_t(m * ldy + n)]);
              if (!(d <= bounds.between_paths(m, n))) {
                ++failures;
                ADD_FAILURE() << what << " y[" << m << ", " << n << "] = " << got
                              << ", scalar path " << scalar[size_t(m * ldy + n)] << ", difference "
                              << d << " > " << bounds.between_paths(m, n);
              }
            }
          }
        }
        if (isa == Isa::Scalar && !float_tiles) scalar = y;
      }
    }
  }
}

// Each test once per instruction set: SKIPPED where this CPU lacks it (tests/support/isa.h).
class MatmulTest : public klein::testing::OnEveryIsa {
 protected:
  ThreadPool pool{2};
  void check_case(const Case& c, ThreadPool& p) { quant::check_case(c, p, isa()); }
};

TEST_P(MatmulTest, SmallAndOddShapes) {
  for (Shape s : {Shape{1, 3, 32}, Shape{1, 16, 64}, Shape{2, 1, 128}, Shape{3, 17, 192},
                  Shape{7, 33, 128}, Shape{12, 16, 64}, Shape{13, 50, 96}, Shape{8, 31, 160},
                  Shape{25, 100, 256}, Shape{100, 3, 128}})
    check_case({s}, pool);
}

TEST_P(MatmulTest, LargeShapesCrossTileAndChunkBoundaries) {
  // M above the row blocks of both paths, K above one float panel and one int8 chunk.
  check_case({{800, 40, 320}}, pool);
  check_case({{20, 40, 4160}}, pool);
  check_case({{1, 130, 2560}}, pool);
  // AMX: row blocks of 32 with a ragged end, an odd number of 16-row groups, K beyond the
  // tile chunk of RowMajor weights.
  check_case({{77, 48, 2112}}, pool);
  // AMX, K above 3072 (chunked K, Y as the accumulator): several wide panels, the last one
  // ragged in N, and a ragged last row block. Large, so only where those plans run.
  if (isa() == Isa::Amx) check_case({{40, 1300, 3104}}, pool);
  // AMX, chunked K with tasks of several row blocks (the first block's micro-kernel calls make
  // the B tiles that the later blocks use), the last task's last block ragged (22 rows).
  if (isa() == Isa::Amx) check_case({{470, 40, 4160}}, pool);
  // The same with X converted per panel and 32-row block instead of once for all panels.
  if (isa() == Isa::Amx)
    check_case({{470, 40, 4160}, Dist::Gauss, Dist::Gauss, 1, 1, 0, 0, true}, pool);
}

// AMX, K above 3072: X converted to bf16 once for all panels or per panel and 32-row block
// are the same arithmetic (the same roundings, the same tile products in the same order), so
// the outputs agree bit for bit, for every weight type that rounds X to one bf16 part.
TEST(MatmulAmx, WidePlanSameWhereverXIsConverted) {
  KLEIN_REQUIRE_ISA(Isa::Amx);  // the wide plan runs on AMX tiles
  ThreadPool pool(2);
  const int64_t M = 100, N = 72, K = 4160, ldx = K + 8;
  const std::vector<float> x = random_matrix(M, ldx, 11, Dist::Gauss, 1.0f);
  const std::vector<float> w = random_matrix(N, K, 12, Dist::Gauss, 1.0f);
  int compared = 0;
  for (auto [type, layout] : testing::all_formats()) {
    const bool quantized = type == DType::Q8 || type == DType::Q4;
    const Packed p(w.data(), N, K, type, layout);
    std::vector<float> shared(size_t(M * N)), per_panel(size_t(M * N));
    MatmulOptions options;
    options.isa = Isa::Amx;
    options.float_on_tiles = !quantized;  // one bf16 part (exact BF16 is three: always per panel)
    ASSERT_TRUE(runs_on_tiles(p.matrix, M, options));
    matmul(x.data(), M, ldx, p.matrix, shared.data(), N, pool, options);
    options.amx_shared_x_bytes = 0;
    matmul(x.data(), M, ldx, p.matrix, per_panel.data(), N, pool, options);
    const std::string what = describe(type, layout, Isa::Amx, {M, N, K});
    EXPECT_EQ(0, std::memcmp(shared.data(), per_panel.data(), shared.size() * sizeof(float)))
        << what;
    ++compared;
  }
  EXPECT_GE(compared, 4);
}

TEST_P(MatmulTest, LargestK) {
  check_case({{1, 19, 12288}}, pool);
  check_case({{14, 35, 12288}}, pool);
  check_case({{33, 35, 12288}}, pool);
}

TEST_P(MatmulTest, Strides) { check_case({{9, 21, 96}, Dist::Gauss, Dist::Gauss, 1, 1, 32, 5}, pool); }

TEST_P(MatmulTest, AdversarialValues) {
  check_case({{5, 20, 64}, Dist::Zeros, Dist::Gauss}, pool);
  check_case({{5, 20, 64}, Dist::Gauss, Dist::Zeros}, pool);
  check_case({{17, 40, 256}, Dist::Outliers, Dist::StudentT3}, pool);
  check_case({{9, 24, 128}, Dist::Gauss, Dist::ColumnScaled, 3e4f, 100.0f}, pool);
  check_case({{9, 24, 128}, Dist::Laplace, Dist::Gauss, 1e-6f, 1e-3f}, pool);
}

// The same call gives the same bits whatever the number of threads.
TEST_P(MatmulTest, ThreadCountDoesNotChangeResults) {
  const int64_t M = 50, N = 70, K = 2112;
  const std::vector<float> x = random_matrix(M, K, 1, Dist::Gauss);
  const std::vector<float> w = random_matrix(N, K, 2, Dist::Gauss);
  ThreadPool one(1), three(3);
  for (auto [type, layout] : testing::all_formats()) {
    const Packed p(w.data(), N, K, type, layout);
    std::vector<float> a(size_t(M * N)), b(size_t(M * N));
    MatmulOptions options;
    options.isa = isa();
    if (!(type == DType::Q8 || type == DType::Q4) && !runs_on_tiles(p.matrix, M, options)) continue;
    matmul(x.data(), M, K, p.matrix, a.data(), N, one, options);
    matmul(x.data(), M, K, p.matrix, b.data(), N, three, options);
    EXPECT_EQ(a, b) << dtype_name(type) << " " << layout_name(layout);
  }
}

// Overall accuracy on model-like data, as a normalised RMS error against the reference.
TEST_P(MatmulTest, TypicalRelativeError) {
  const int64_t M = 32, N = 64, K = 3072;
  const std::vector<float> x = random_matrix(M, K, 11, Dist::Gauss);
  const std::vector<float> w = random_matrix(N, K, 12, Dist::ColumnScaled, 0.02f);
  for (auto [type, layout] : testing::all_formats()) {
    const Packed p(w.data(), N, K, type, layout);
    std::vector<float> ref(size_t(M * N)), y(size_t(M * N));
    matmul_reference(x.data(), M, K, p.matrix, ref.data(), N);
    {
      const Isa isa = this->isa();
      {
        MatmulOptions options;
        options.isa = isa;
        if (!(type == DType::Q8 || type == DType::Q4) && !runs_on_tiles(p.matrix, M, options)) continue;
        matmul(x.data(), M, K, p.matrix, y.data(), N, pool, options);
        double err = 0, norm = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          err += double(y[i] - ref[i]) * double(y[i] - ref[i]);
          norm += double(ref[i]) * ref[i];
        }
        const double rel = std::sqrt(err / norm);
        // Float32 rounding only (BF16 in three parts on AMX, measured ~3e-7), int8 activations
        // (measured 5.4e-3), or bf16 activations and weights on AMX tiles (measured 1.8e-3).
        const bool rounded = type == DType::Q8 || type == DType::Q4;
        const double limit = !rounded ? 2e-6 : isa == Isa::Amx ? 3e-3 : 8e-3;
        EXPECT_LT(rel, limit) << describe(type, layout, isa, {M, N, K});
      }
    }
  }
}

// Every vector instruction set quantizes activations to the same bytes as the scalar code
// (AMX multiplies bf16 tiles and quantizes nothing: not a case here).
class ActivationQuantization : public klein::testing::OnEveryIsa {};

TEST_P(ActivationQuantization, BitIdenticalToScalar) {
  const int64_t rows = 5, K = 256, nb = K / kBlock;
  std::vector<float> x = random_matrix(rows, K, 9, Dist::Outliers);
  x[7] = 0.5f;  // ties at 127 * 0.5 / max are rare; make some exact values
  for (int i = 32; i < 64; ++i) x[size_t(i)] = 0.0f;
  // Compared in row order, since each instruction set tiles the rows its own way.
  auto run = [&](const detail::Kernels& k) {
    const size_t entries = size_t((rows + k.int_rows - 1) / k.int_rows * k.int_rows * nb);
    std::vector<int8_t> q(entries * kBlock);
    std::vector<float> scale(entries), scaled(entries);
    std::vector<int32_t> bias(entries);
    detail::ActBlocks a{q.data(), scale.data(), scaled.data(), bias.data(), nb, k.int_rows};
    k.quantize_rows(x.data(), K, 0, rows, K, a);
    std::vector<int8_t> q_rows;
    std::vector<float> numbers;
    for (int64_t m = 0; m < rows; ++m) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t e = a.entry(m, b);
        q_rows.insert(q_rows.end(), q.begin() + e * kBlock, q.begin() + (e + 1) * kBlock);
        numbers.insert(numbers.end(), {scale[size_t(e)], scaled[size_t(e)], float(bias[size_t(e)])});
      }
    }
    return std::make_pair(q_rows, numbers);
  };
  const auto expected = run(detail::scalar_kernels());
  switch (isa()) {
#if defined(KLEIN_X86)
    case Isa::Avx2: EXPECT_EQ(run(detail::avx2_kernels()), expected); break;
    case Isa::Avx512: EXPECT_EQ(run(detail::avx512_kernels()), expected); break;
#endif
#if defined(KLEIN_ARM64)
    case Isa::Neon: EXPECT_EQ(run(detail::neon_kernels()), expected); break;
#endif
    default: FAIL() << "no activation quantizer for " << isa_name(isa());
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, ActivationQuantization, ::testing::ValuesIn([] {
                           std::vector<Isa> isas = klein::testing::compiled_isas();
                           std::erase(isas, Isa::Amx);
                           std::erase(isas, Isa::Scalar);
                           return isas;
                         }()),
                         klein::testing::isa_param_name);

TEST(MatmulErrors, BadInputsAreReported) {
  ThreadPool pool(1);
  std::vector<float> w(16 * 48, 1.0f), x(48, 1.0f), y(16);
  Matrix m{DType::F32, Layout::RowMajor, 16, 48, w.data(), w.size() * 4};
  EXPECT_THROW(matmul(x.data(), 1, 48, m, y.data(), 16, pool), Error);  // K not a multiple of 32
  m.cols = 32;
  m.nbytes = 10;
  EXPECT_THROW(matmul(x.data(), 1, 32, m, y.data(), 16, pool), Error);  // too few bytes
  m.nbytes = w.size() * 4;
  EXPECT_THROW(matmul(x.data(), 1, 16, m, y.data(), 16, pool), Error);  // ldx < K
  for (Isa isa : {Isa::Avx2, Isa::Avx512, Isa::Neon}) {
    if (!isa_available(isa)) {
      EXPECT_THROW(matmul(x.data(), 1, 32, m, y.data(), 16, pool, {isa}), Error);
    }
  }
  EXPECT_NO_THROW(matmul(x.data(), 0, 32, m, y.data(), 16, pool));
}

TEST(Isa, AvailableListIsOrdered) {
  const std::vector<Isa> isas = available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::Scalar);
  EXPECT_EQ(isas.back(), best_isa());
}

// The cross-build test script runs this program under qemu with several CPU models and says
// which kernel variants each must select (KLEIN_EXPECT_CPU): otherwise a CPU model without,
// say, SMMLA would pass every test without ever running the SMMLA tiles.
TEST(Isa, DetectsTheFeaturesTheRunExpects) {
  const char* expected = std::getenv("KLEIN_EXPECT_CPU");
  if (!expected) GTEST_SKIP() << "KLEIN_EXPECT_CPU is not set";
  EXPECT_EQ(describe(cpu_features()), expected);
}

// Which calls take the AMX path (what ops::linear asks before choosing OpenBLAS instead).
TEST(Isa, RunsOnTilesOnlyWhereTheTilePathApplies) {
  auto matrix = [](DType type, int64_t cols) {
    Matrix m;
    m.type = type;
    m.rows = 64;
    m.cols = cols;
    return m;
  };
  MatmulOptions rounded, avx512;
  rounded.float_on_tiles = true;
  avx512.isa = Isa::Avx512;
  const bool amx = isa_available(Isa::Amx);
  EXPECT_EQ(runs_on_tiles(matrix(DType::BF16, 64), 32), amx);
  EXPECT_EQ(runs_on_tiles(matrix(DType::Q8, 64), 32), amx);
  EXPECT_EQ(runs_on_tiles(matrix(DType::F32, 64), 32, rounded), amx);
  EXPECT_FALSE(runs_on_tiles(matrix(DType::BF16, 64), 31));        // too few rows
  EXPECT_FALSE(runs_on_tiles(matrix(DType::BF16, 48), 32));        // K not a multiple of 32
  EXPECT_FALSE(runs_on_tiles(matrix(DType::F32, 64), 32));         // OpenBLAS (ops::linear)
  EXPECT_FALSE(runs_on_tiles(matrix(DType::F16, 64), 32));
  EXPECT_FALSE(runs_on_tiles(matrix(DType::BF16, 64), 32, avx512));  // another path forced
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(MatmulTest);

}  // namespace
}  // namespace klein::quant
