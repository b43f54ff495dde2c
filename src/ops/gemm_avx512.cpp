// The AVX-512 kernel of gemm.cpp: 12 rows x 32 columns, 24 accumulators of 16 floats.
#include <immintrin.h>

#include "ops/gemm_kernels.h"

namespace klein::ops::detail {

namespace {

struct Avx512 {
  using Reg = __m512;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg splat(const float* p) { return _mm512_set1_ps(*p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, Reg r) { _mm512_storeu_ps(p, r); }
};

}  // namespace

GemmKernel gemm_kernel_avx512() {
  GemmKernel k = make_gemm_kernel<Avx512, 12>();
  k.transpose8 = transpose8_avx2;  // every AVX-512 CPU has AVX2
  return k;
}

}  // namespace klein::ops::detail
