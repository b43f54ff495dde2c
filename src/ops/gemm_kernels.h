#pragma once
// Internal to gemm.cpp: the micro-kernels per instruction set. Each multiplies mr <= MR rows
// of A (value k of row i at a[i·row + k·step]: packed, row = 1 and step = MR; as the caller
// holds it, row = lda and step = 1) with one packed panel of B (kc rows of NR floats, zero
// beyond the panel's n columns) and writes the first n columns of the mr x NR result:
//   c[i·ldc + j] = (accumulate ? c[i·ldc + j] : 0) + alpha · Σ_k a[i·row + k·step] · panel[k·NR + j]
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>

namespace klein::ops::detail {

struct GemmMicroArgs {
  int64_t mr = 0, n = 0, kc = 0;
  const float* a = nullptr;
  int64_t row = 0, step = 0;
  const float* panel = nullptr;
  float* c = nullptr;
  int64_t ldc = 0;
  float alpha = 1;
  bool accumulate = false;
};

using GemmMicro = void (*)(const GemmMicroArgs&);

// dst[k·ldd + j] = src[j·lds + k] for j, k < 8: the 8 x 8 blocks in which a transposed B is
// packed (null: value by value).
using Transpose8 = void (*)(const float* src, int64_t lds, float* dst, int64_t ldd);

struct GemmKernel {
  int64_t mr = 0, nr = 0;
  GemmMicro micro = nullptr;
  Transpose8 transpose8 = nullptr;
};

void transpose8_avx2(const float* src, int64_t lds, float* dst, int64_t ldd);

GemmKernel gemm_kernel_scalar();
GemmKernel gemm_kernel_avx2();
GemmKernel gemm_kernel_avx512();
GemmKernel gemm_kernel_neon();

// Everything below is compiled into each kernel's file with that file's instruction set:
// internal linkage, so that the linker never hands one file's copy (AVX-512 code, say) to
// another's caller.
namespace {

// The micro-kernel for a vector type: MR rows x 2 vectors of columns, the sums in 2·MR
// registers. V provides Reg (a vector of floats), load(p), splat(p) (*p in every lane),
// fma(a, b, c) = a·b + c and store(p, r). Instantiated once per instruction set
// (gemm_<isa>.cpp), with that file's compiler flags.
template <class V, int MR>
void gemm_micro(const GemmMicroArgs& m) {
  using Reg = typename V::Reg;
  constexpr int64_t W = int64_t(sizeof(Reg) / sizeof(float)), NR = 2 * W;
  const float zero_value = 0.0f;
  const Reg zero = V::splat(&zero_value);
  Reg lo[MR], hi[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) lo[i] = hi[i] = zero;
  // Locals, so that the compiler keeps the sums in registers across the loop.
  const float* a = m.a;
  const int64_t row = m.row, step = m.step, kc = m.kc;
  const float* b = m.panel;
  for (int64_t k = 0; k < kc; ++k, b += NR, a += step) {
    const Reg b0 = V::load(b), b1 = V::load(b + W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const Reg x = V::splat(a + i * row);
      lo[i] = V::fma(x, b0, lo[i]);
      hi[i] = V::fma(x, b1, hi[i]);
    }
  }
  const Reg alpha = V::splat(&m.alpha);
  // C = alpha·sums (+ C) with the same vector operations whether the panel is full or not
  // (a partial one goes through a row buffer), so a column's value does not depend on where
  // the call's panels end.
  const bool full = m.n == NR;
  float buffer[NR] = {};
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* c = full ? m.c + i * m.ldc : buffer;
    if (!full && m.accumulate) std::memcpy(buffer, m.c + i * m.ldc, size_t(m.n) * sizeof(float));
    V::store(c, V::fma(alpha, lo[i], m.accumulate ? V::load(c) : zero));
    V::store(c + W, V::fma(alpha, hi[i], m.accumulate ? V::load(c + W) : zero));
    if (!full) std::memcpy(m.c + i * m.ldc, buffer, size_t(m.n) * sizeof(float));
  }
}

// The kernel of vector type V with at most MaxMr rows: one instantiation per row count.
template <class V, int MaxMr>
GemmKernel make_gemm_kernel() {
  static constexpr auto table = []<int... I>(std::integer_sequence<int, I...>) {
    return std::array<GemmMicro, MaxMr>{&gemm_micro<V, I + 1>...};
  }(std::make_integer_sequence<int, MaxMr>());
  return {MaxMr, int64_t(2 * sizeof(typename V::Reg) / sizeof(float)),
          [](const GemmMicroArgs& m) { table[std::size_t(m.mr - 1)](m); }};
}

}  // namespace

}  // namespace klein::ops::detail
