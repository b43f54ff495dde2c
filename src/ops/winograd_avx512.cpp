// The AVX-512 transforms of conv2d_winograd.cpp: 16 tiles per group. load4 and store4
// transpose 4x4 blocks within each 128-bit lane, so lane 4q + s holds tile 4s + q.
#include <immintrin.h>

#include "ops/winograd_kernels.h"

namespace klein::ops::detail {

namespace {

// Rows a, b, c, d of 4x4 blocks (one per 128-bit lane) transposed in place. (GCC 12 takes the
// "undefined" pass-through operand inside _mm512_unpack*_ps for an uninitialised variable.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void transpose4(__m512& a, __m512& b, __m512& c, __m512& d) {
  const __m512 t0 = _mm512_unpacklo_ps(a, b), t1 = _mm512_unpackhi_ps(a, b);
  const __m512 t2 = _mm512_unpacklo_ps(c, d), t3 = _mm512_unpackhi_ps(c, d);
  a = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  b = _mm512_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  c = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  d = _mm512_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
}
#pragma GCC diagnostic pop

struct Avx512 {
  using Reg = __m512;
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg r) { _mm512_storeu_ps(p, r); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg set(float x) { return _mm512_set1_ps(x); }
  static void load4(const float* p, Reg r[4]) {
    for (int e = 0; e < 4; ++e) r[e] = _mm512_loadu_ps(p + 16 * e);
    transpose4(r[0], r[1], r[2], r[3]);
  }
  static void store4(float* p, const Reg r[4]) {
    Reg a = r[0], b = r[1], c = r[2], d = r[3];
    transpose4(a, b, c, d);
    _mm512_storeu_ps(p, a);
    _mm512_storeu_ps(p + 16, b);
    _mm512_storeu_ps(p + 32, c);
    _mm512_storeu_ps(p + 48, d);
  }
};

}  // namespace

WinogradKernels winograd_kernels_avx512() { return Winograd<Avx512>::kernels(); }

}  // namespace klein::ops::detail
