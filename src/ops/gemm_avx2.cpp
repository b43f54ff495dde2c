// The AVX2 kernel of gemm.cpp: 6 rows x 16 columns, 12 accumulators of 8 floats.
#include <immintrin.h>

#include "ops/gemm_kernels.h"

namespace klein::ops::detail {

namespace {

struct Avx2 {
  using Reg = __m256;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg splat(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, Reg r) { _mm256_storeu_ps(p, r); }
};

}  // namespace

GemmKernel gemm_kernel_avx2() { return make_gemm_kernel<Avx2, 6>(); }

}  // namespace klein::ops::detail
