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

void transpose8_avx2(const float* s, int64_t lds, float* d, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * lds);
  for (int i = 0; i < 8; i += 2) {  // pairs of rows interleaved
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {  // then pairs of pairs: 4 x 4 blocks in each 128-bit half
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {  // and the halves of rows i and i + 4 exchanged
    _mm256_storeu_ps(d + i * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * ldd, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

GemmKernel gemm_kernel_avx2() {
  GemmKernel k = make_gemm_kernel<Avx2, 6>();
  k.transpose8 = transpose8_avx2;
  return k;
}

}  // namespace klein::ops::detail
