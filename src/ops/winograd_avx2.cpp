// The AVX2 transforms of conv2d_winograd.cpp: 8 tiles per group. load4 and store4 transpose
// 4x4 blocks within each 128-bit lane, so lane 4q + s holds tile 2s + q.
#include <immintrin.h>

#include "ops/winograd_kernels.h"

namespace klein::ops::detail {

namespace {

// Rows a, b, c, d of 4x4 blocks (one per 128-bit lane) transposed in place.
void transpose4(__m256& a, __m256& b, __m256& c, __m256& d) {
  const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b);
  const __m256 t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);
  a = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  b = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  c = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  d = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}

struct Avx2 {
  using Reg = __m256;
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg r) { _mm256_storeu_ps(p, r); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg set(float x) { return _mm256_set1_ps(x); }
  static void load4(const float* p, Reg r[4]) {
    for (int e = 0; e < 4; ++e) r[e] = _mm256_loadu_ps(p + 8 * e);
    transpose4(r[0], r[1], r[2], r[3]);
  }
  static void store4(float* p, const Reg r[4]) {
    Reg a = r[0], b = r[1], c = r[2], d = r[3];
    transpose4(a, b, c, d);
    _mm256_storeu_ps(p, a);
    _mm256_storeu_ps(p + 8, b);
    _mm256_storeu_ps(p + 16, c);
    _mm256_storeu_ps(p + 24, d);
  }
};

}  // namespace

WinogradKernels winograd_kernels_avx2() { return Winograd<Avx2>::kernels(); }

}  // namespace klein::ops::detail
