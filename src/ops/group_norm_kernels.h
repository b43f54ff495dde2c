#pragma once
// Internal to group_norm.cpp: y = t((x - mean)·scale + shift) over a row, t = SiLU or the
// identity, compiled once per instruction set (group_norm_<isa>.cpp) from the one source
// below. Those files are built with -ffp-contract=off, so the compiler fuses no multiply-add
// and every copy rounds exactly as the baseline one: the same bits on every path (tested).
#include <bit>
#include <cstdint>

#include "quant/matmul.h"

namespace klein::ops::detail {

using AffineKernel = void (*)(float mean, float scale, float shift, bool silu, const float* x,
                              float* y, int64_t n);

AffineKernel affine_kernel_baseline();
AffineKernel affine_kernel_avx2();
AffineKernel affine_kernel_avx512();
// The copy for `isa` (the baseline one where there is no wider copy).
AffineKernel affine_kernel(quant::Isa isa);

// Internal linkage: each file's copy is its own.
namespace {

// e^x without a library call or a floating-point comparison, so the SiLU loop vectorises
// (it runs over every input value of every normalised convolution: 10^9 values per 1024x1024
// decode; twice as fast as std::exp at the baseline ISA). e^x = 2^n · e^r with
// n = round(x·log2 e), r = x - n·ln 2 in [-ln2/2, ln2/2], e^r from the degree-6 polynomial of
// Cephes' expf; within 2e-7 relative of the exact value (tested). |x| is clamped to 87 on its
// bit pattern (an integer compare; NaN passes through) so 2^n stays a normal float.
float exp_vectorisable(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x), magnitude = bits & 0x7fffffffu;
  constexpr uint32_t kLimit = std::bit_cast<uint32_t>(87.0f), kInf = 0x7f800000u;
  x = std::bit_cast<float>(magnitude > kLimit && magnitude <= kInf ? (bits & 0x80000000u) | kLimit
                                                                   : bits);
  constexpr float kRound = 12582912.0f;  // 1.5·2^23: adding it rounds to an integer
  const float shifted = x * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  // n sits in the low mantissa bits of `shifted`; move it into an exponent field.
  const int32_t ni = std::bit_cast<int32_t>(shifted) - std::bit_cast<int32_t>(kRound);
  return er * std::bit_cast<float>((ni + 127) << 23);
}

float silu_value(float v) { return v / (1.0f + exp_vectorisable(-v)); }

// (Unused where only the declarations above are wanted: the tests include this header.)
[[maybe_unused]] void affine_rows(float m, float s, float b, bool silu, const float* x, float* y,
                                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) * s + b;
  if (silu)
    for (int64_t i = 0; i < n; ++i) y[i] = silu_value(y[i]);
}

}  // namespace

}  // namespace klein::ops::detail
