// The AVX-512 GEMM kernel (src/ops/gemm_avx512.cpp) run on any x86 machine: its source is
// compiled here against plain C++ stand-ins for the four intrinsics it uses (16 float lanes;
// fused multiply-add as fmaf, as VFMADD rounds), so its instantiation (12 rows x 32 columns,
// every row count, partial panels, packed A) is checked where the CPU has no AVX-512. Where
// it has, Gemm.MatchesFloat64OnEveryEdgeAndIsa runs the real instructions too.
#include <gtest/gtest.h>

#if defined(KLEIN_X86)

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

// Keep the real intrinsics header out of the kernel's source (its include guard in GCC and
// in clang).
#define _IMMINTRIN_H_INCLUDED
#define __IMMINTRIN_H
namespace emulated {
struct M512 {
  float v[16];
};
}  // namespace emulated
using __m512 = emulated::M512;
inline __m512 _mm512_loadu_ps(const void* p) {
  __m512 r;
  std::memcpy(r.v, p, sizeof r.v);
  return r;
}
inline __m512 _mm512_set1_ps(float x) {
  __m512 r;
  for (float& v : r.v) v = x;
  return r;
}
inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  for (int i = 0; i < 16; ++i) c.v[i] = std::fmaf(a.v[i], b.v[i], c.v[i]);
  return c;
}
inline void _mm512_storeu_ps(void* p, __m512 r) { std::memcpy(p, r.v, sizeof r.v); }

#define gemm_kernel_avx512 gemm_kernel_avx512_emulated
#include "../../src/ops/gemm_avx512.cpp"
#undef gemm_kernel_avx512

#include "ops/gemm_kernels.h"
#include "support/isa.h"

namespace klein::ops {
namespace {

// C = A · op(B) through the emulated kernel's micro-tiles, as gemm.cpp drives them (A in place
// and packed, B packed in panels of 32), against a float64 sum.
TEST(GemmEmulated, Avx512KernelMatchesFloat64) {
  klein::testing::log_isa_path("ran", "avx512-emulated");
  const detail::GemmKernel kern = detail::gemm_kernel_avx512_emulated();
  ASSERT_EQ(kern.mr, 12);
  ASSERT_EQ(kern.nr, 32);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (int64_t mr = 1; mr <= kern.mr; ++mr)
    for (int64_t n : {int64_t(1), int64_t(16), int64_t(17), int64_t(32)})
      for (bool packed_a : {false, true})
        for (bool accumulate : {false, true}) {
          const int64_t kc = 37;
          std::vector<float> a(size_t(kern.mr * kc)), panel(size_t(kc * kern.nr), 0.0f),
              c(size_t(kern.mr * kern.nr), 0.5f);
          for (float& x : a) x = d(rng);
          for (int64_t k = 0; k < kc; ++k)
            for (int64_t j = 0; j < n; ++j) panel[size_t(k * kern.nr + j)] = d(rng);
          const std::vector<float> c0 = c;
          detail::GemmMicroArgs m;
          m.mr = mr;
          m.n = n;
          m.kc = kc;
          m.a = a.data();
          m.row = packed_a ? 1 : kc;  // value k of row i at a[i·row + k·step]
          m.step = packed_a ? kern.mr : 1;
          m.panel = panel.data();
          m.c = c.data();
          m.ldc = kern.nr;
          m.alpha = 0.5f;
          m.accumulate = accumulate;
          kern.micro(m);
          for (int64_t i = 0; i < kern.mr; ++i)
            for (int64_t j = 0; j < kern.nr; ++j) {
              const size_t at = size_t(i * kern.nr + j);
              if (i >= mr || j >= n) {
                ASSERT_EQ(c[at], c0[at]) << "wrote outside the tile at (" << i << ", " << j << ")";
                continue;
              }
              double sum = 0;
              for (int64_t k = 0; k < kc; ++k)
                sum += double(a[size_t(i * m.row + k * m.step)]) * panel[size_t(k * kern.nr + j)];
              const double want = 0.5 * sum + (accumulate ? c0[at] : 0.0);
              ASSERT_NEAR(c[at], want, 1e-5)
                  << "mr " << mr << ", n " << n << (packed_a ? ", packed A" : "") << " at (" << i
                  << ", " << j << ")";
            }
        }
}

}  // namespace
}  // namespace klein::ops

#endif
