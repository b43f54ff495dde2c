// The benchmark runner behind `klein bench matmul` (bench/support), on shapes small enough for
// a unit test.
#include <gtest/gtest.h>

#include <vector>

#include "bench/support/matmul_bench.h"

namespace klein::bench {
namespace {

TEST(BenchMatmul, ReportsEveryTypeIsaAndShape) {
  MatmulBenchOptions options;
  options.types = {DType::BF16, DType::Q4};
  options.isas = {Isa::Scalar, quant::best_isa()};
  options.shapes = {{3, 48, 64}, {1, 32, 96}};
  options.min_seconds = 0.001;
  options.matvec_bytes = 1 << 20;
  int sgemm_calls = 0;
  options.sgemm = [&](const float*, int64_t, const float*, int64_t, int64_t, float*) {
    ++sgemm_calls;
  };
  const std::vector<MatmulBenchRow> rows = run_matmul_bench(options, 2);
  ASSERT_EQ(rows.size(), 2u * 2 * 2);
  EXPECT_GT(sgemm_calls, 0);
  for (const MatmulBenchRow& r : rows) {
    EXPECT_GT(r.gops, 0) << dtype_name(r.type) << " " << quant::isa_name(r.isa);
    EXPECT_GT(r.sgemm_gops, 0);
    EXPECT_GT(r.weight_gbps, 0);
    EXPECT_EQ(r.copy_gbps > 0, r.shape.M == 1);
  }
}

TEST(BenchMatmul, ShapesCoverTheModel) {
  EXPECT_EQ(matmul_bench_shapes(true).size(), 4u * 9);
  for (const MatmulShape& s : matmul_bench_shapes(false)) EXPECT_EQ(s.K % 32, 0);
}

}  // namespace
}  // namespace klein::bench
