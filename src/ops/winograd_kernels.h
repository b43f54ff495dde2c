#pragma once
// Internal to conv2d_winograd.cpp: the transforms of the Winograd F(4x4, 3x3) convolution per
// instruction set.
//
// A 3x3 stride-1 convolution computes each 4x4 tile of output from the 6x6 tile of input
// under it. In the transformed ("Winograd") domain the 3x3 taps become 36 points, and the
// convolution becomes one product per point instead of nine per output value:
//   V = Bᵀ d B      (input tile d 6x6, per input channel)
//   U = G g Gᵀ      (weights g 3x3, per output and input channel; conv2d_winograd.cpp)
//   M[ξ] = Σ_c U[ξ][co][c] · V[ξ][c]   (36 matrix products over the channels: ops/gemm)
//   Y = Aᵀ M A      (output tile 4x4, per output channel)
// with the matrices of Lavin and Gray's F(4, 3) on the points 0, ±1, ±2 and ∞:
//   Bᵀ = [4  0 -5  0  1  0]   G = [ 1/4     0     0]   Aᵀ = [1  1  1  1  1  0]
//        [0 -4 -4  1  1  0]       [-1/6  -1/6  -1/6]        [0  1 -1  2 -2  0]
//        [0  4 -4 -1  1  0]       [-1/6   1/6  -1/6]        [0  1  1  4  4  0]
//        [0 -2 -1  2  1  0]       [1/24  1/12   1/6]        [0  1 -1  8 -8  1]
//        [0  2 -1 -2  1  0]       [1/24 -1/12   1/6]
//        [0  4  0 -5  0  1]       [   0     0     1]
// Point ξ = 6i + j is row i and column j of the 6x6 transformed tile: i pairs with the
// vertical (ky) direction, j with the horizontal (kx) one.
//
// The kernels work on one group of W tiles side by side in a row of tiles (W = the vector's
// floats), one vector lane per tile: tile t of the group reads input columns 4t .. 4t + 5 and
// writes output columns 4t .. 4t + 3. Lanes need not hold the group's tiles in order (the
// AVX kernels transpose 4x4 blocks within 128-bit lanes, which permutes them): the input
// transform writes point ξ of the group's tiles as one vector, the output transform reads a
// vector back in the same lane order and undoes the permutation, and the products in between
// treat every lane (a GEMM column) alike.
#include <cstdint>

namespace klein::ops::detail {

constexpr int64_t kWinogradPoints = 36;

struct WinogradKernels {
  int64_t lanes = 0;  // W: tiles per group
  // v[ξ·ps + l] for ξ < 36 and the W lanes l: point ξ of the group's tiles, from input rows
  // rows[r] (r < 6), each readable at [0, 4·W + 4) (columns 4·W + 2 and up are not used).
  void (*input)(const float* const rows[6], float* v, int64_t ps) = nullptr;
  // out[i][4t + j] for i, j < 4 and the group's W tiles t: the output tiles from their points
  // m[ξ·ps + l].
  void (*output)(const float* m, int64_t ps, float* const out[4]) = nullptr;
  // u[ξ·ps + c] = (G g_c Gᵀ)[ξ] for the n kernels g_c (n a multiple of W) given tap by tap:
  // tap 3a + b of kernel c at taps[(3a + b)·n + c]. In float32.
  void (*weights)(const float* taps, int64_t n, float* u, int64_t ps) = nullptr;
};

WinogradKernels winograd_kernels_scalar();
WinogradKernels winograd_kernels_avx2();
WinogradKernels winograd_kernels_avx512();
WinogradKernels winograd_kernels_neon();

// Everything below is compiled into each kernel's file with that file's instruction set
// (internal linkage, as in gemm_kernels.h).
namespace {

// V provides Reg, load, store, add, sub, mul, fma(a, b, c) = a·b + c, set(x) (x in every lane),
// load4(p, r) (r[e] lane l = p[4·tile(l) + e] for the 4·W floats at p) and store4(p, r) (its
// inverse, writing the 4·W floats at p).
template <class V>
struct Winograd {
  using Reg = typename V::Reg;
  static constexpr int64_t W = int64_t(sizeof(Reg) / sizeof(float));

  // The 6-point transform of Bᵀ: out[i] = Σ_r Bᵀ[i][r] · d[r].
  static void input6(const Reg d[6], Reg out[6]) {
    const Reg four = V::set(4.0f), minus_five = V::set(-5.0f), two = V::set(2.0f);
    const Reg s12 = V::add(d[1], d[2]), d12 = V::sub(d[1], d[2]);
    const Reg s34 = V::add(d[4], d[3]), d43 = V::sub(d[4], d[3]);
    const Reg d42 = V::sub(d[4], d[2]), d31 = V::sub(d[3], d[1]);
    out[0] = V::fma(minus_five, d[2], V::fma(four, d[0], d[4]));
    out[1] = V::fma(V::set(-4.0f), s12, s34);
    out[2] = V::fma(four, d12, d43);
    out[3] = V::fma(two, d31, d42);
    out[4] = V::fma(V::set(-2.0f), d31, d42);
    out[5] = V::fma(minus_five, d[3], V::fma(four, d[1], d[5]));
  }

  // The 6-to-4 transform of Aᵀ: out[i] = Σ_a Aᵀ[i][a] · m[a].
  static void output6(const Reg m[6], Reg out[4]) {
    const Reg a = V::add(m[1], m[2]), b = V::sub(m[1], m[2]);
    const Reg c = V::add(m[3], m[4]), d = V::sub(m[3], m[4]);
    out[0] = V::add(V::add(m[0], a), c);
    out[1] = V::fma(V::set(2.0f), d, b);
    out[2] = V::fma(V::set(4.0f), c, a);
    out[3] = V::add(V::fma(V::set(8.0f), d, b), m[5]);
  }

  static void input(const float* const rows[6], float* v, int64_t ps) {
    Reg e[6][6];  // e[r][j]: column transform j of input row r
    for (int r = 0; r < 6; ++r) {
      Reg d[6], next[4];
      V::load4(rows[r], d);           // columns 4t + 0 .. 4t + 3
      V::load4(rows[r] + 4, next);    // columns 4t + 4 .. 4t + 7 (the next tile's first four)
      d[4] = next[0];
      d[5] = next[1];
      input6(d, e[r]);
    }
    for (int j = 0; j < 6; ++j) {
      const Reg column[6] = {e[0][j], e[1][j], e[2][j], e[3][j], e[4][j], e[5][j]};
      Reg out[6];
      input6(column, out);
      for (int i = 0; i < 6; ++i) V::store(v + (6 * i + j) * ps, out[i]);
    }
  }

  static void output(const float* m, int64_t ps, float* const out[4]) {
    Reg f[6][4];  // f[a][j]: row a of M through Aᵀ along its columns
    for (int a = 0; a < 6; ++a) {
      Reg row[6];
      for (int b = 0; b < 6; ++b) row[b] = V::load(m + (6 * a + b) * ps);
      output6(row, f[a]);
    }
    for (int j = 0; j < 4; ++j) {
      const Reg column[6] = {f[0][j], f[1][j], f[2][j], f[3][j], f[4][j], f[5][j]};
      Reg y[4];
      output6(column, y);
      for (int i = 0; i < 4; ++i) f[i][j] = y[i];  // f[i][j] is now output row i, column j
    }
    for (int i = 0; i < 4; ++i) V::store4(out[i], f[i]);
  }

  // The 3-to-6 transform of G: out[j] = Σ_b G[j][b] · g[b].
  static void kernel6(const Reg g[3], Reg out[6]) {
    const Reg sixth = V::set(1.0f / 6), twelfth = V::set(1.0f / 12), quarter = V::set(0.25f);
    const Reg outer = V::add(g[0], g[2]);                        // g0 + g2
    const Reg s = V::mul(sixth, V::add(outer, g[1]));             // (g0 + g1 + g2) / 6
    const Reg d = V::mul(sixth, V::sub(outer, g[1]));             // (g0 - g1 + g2) / 6
    const Reg e = V::fma(V::set(1.0f / 24), g[0], V::mul(sixth, g[2]));  // g0 / 24 + g2 / 6
    out[0] = V::mul(quarter, g[0]);
    out[1] = V::sub(V::set(0.0f), s);
    out[2] = V::sub(V::set(0.0f), d);
    out[3] = V::fma(twelfth, g[1], e);
    out[4] = V::fma(V::set(-1.0f / 12), g[1], e);
    out[5] = g[2];
  }

  static void weights(const float* taps, int64_t n, float* u, int64_t ps) {
    for (int64_t c = 0; c < n; c += W) {
      Reg h[3][6];  // h[a][j]: row a of the kernel through G along its columns
      for (int a = 0; a < 3; ++a) {
        const Reg g[3] = {V::load(taps + (3 * a) * n + c), V::load(taps + (3 * a + 1) * n + c),
                          V::load(taps + (3 * a + 2) * n + c)};
        kernel6(g, h[a]);
      }
      for (int j = 0; j < 6; ++j) {
        const Reg column[3] = {h[0][j], h[1][j], h[2][j]};
        Reg out[6];
        kernel6(column, out);
        for (int i = 0; i < 6; ++i) V::store(u + (6 * i + j) * ps + c, out[i]);
      }
    }
  }

  static WinogradKernels kernels() { return {W, &input, &output, &weights}; }
};

}  // namespace

}  // namespace klein::ops::detail
