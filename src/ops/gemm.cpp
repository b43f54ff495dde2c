#include "ops/gemm.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/tensor.h"
#include "ops/gemm_kernels.h"

namespace klein::ops {

namespace detail {

namespace {

// The portable kernel: 4 rows x 8 columns, "vectors" of 4 floats that the compiler may map
// to whatever the target has.
struct ScalarGemmVec {
  struct Reg {
    float v[4];
  };
  static Reg load(const float* p) { return {{p[0], p[1], p[2], p[3]}}; }
  static Reg splat(const float* p) { return {{*p, *p, *p, *p}}; }
  static Reg fma(Reg a, Reg b, Reg c) {
    for (int l = 0; l < 4; ++l) c.v[l] += a.v[l] * b.v[l];
    return c;
  }
  static void store(float* p, Reg r) {
    for (int l = 0; l < 4; ++l) p[l] = r.v[l];
  }
};

}  // namespace

GemmKernel gemm_kernel_scalar() { return make_gemm_kernel<ScalarGemmVec, 4>(); }

}  // namespace detail

namespace {

using detail::GemmKernel;

// op(B) is packed KC rows by NC columns at a time (in L2), A MC rows by KC at a time (96 KiB).
// MC is a multiple of every kernel's MR (4, 6, 8, 12). A packed panel of B (KC x NR) stays in
// L1 while the rows of A pass it. Packing costs about as much per value as a few
// multiply-adds, and A's values are used N times: so A is packed only when N is large
// (kPackAColumns), where it also takes A's rows off strides such as 4096 bytes, which compete
// for L1 sets; otherwise the kernel reads A where it is.
constexpr int64_t kKc = 256, kMc = 96;
// op(B) packs up to this many floats at a time (256 KiB, with the packed A inside this CPU's
// 512 KiB L2): all of N when K is short (Q·Kᵀ of 512 keys, K = 128).
constexpr int64_t kPackB = 64 * 1024;
constexpr int64_t kPackAColumns = 256;

GemmKernel kernel_for(quant::Isa isa) {
  switch (isa) {
#if defined(KLEIN_X86)
    case quant::Isa::Avx512:
    case quant::Isa::Amx: return detail::gemm_kernel_avx512();
    case quant::Isa::Avx2: return detail::gemm_kernel_avx2();
#endif
#if defined(KLEIN_ARM64)
    case quant::Isa::Neon: return detail::gemm_kernel_neon();
#endif
    default: return detail::gemm_kernel_scalar();
  }
}

// Columns [j0, j0 + nc) and rows [k0, k0 + kc) of op(B) as panels of nr columns: panel p
// holds kc rows of nr floats, zero beyond the last column.
void pack_b(const GemmArgs& g, int64_t k0, int64_t kc, int64_t j0, int64_t nc,
            const GemmKernel& kern, float* pack) {
  const int64_t nr = kern.nr;
  for (int64_t p = 0; p < nc; p += nr) {
    const int64_t n = std::min(nr, nc - p);
    float* panel = pack + p * kc;
    if (g.b_transposed) {
      // Column j of op(B) is row j of B: read along it, write down the panel's column; in
      // 8 x 8 blocks where the kernel has a transpose.
      const float* rows = g.b + (j0 + p) * g.ldb + k0;
      const int64_t j8 = kern.transpose8 ? n / 8 * 8 : 0, k8 = kc / 8 * 8;
      for (int64_t j = 0; j < j8; j += 8)
        for (int64_t k = 0; k < k8; k += 8)
          kern.transpose8(rows + j * g.ldb + k, g.ldb, panel + k * nr + j, nr);
      for (int64_t j = 0; j < n; ++j) {
        const float* src = rows + j * g.ldb;
        for (int64_t k = j < j8 ? k8 : 0; k < kc; ++k) panel[k * nr + j] = src[k];
      }
      for (int64_t j = n; j < nr; ++j)
        for (int64_t k = 0; k < kc; ++k) panel[k * nr + j] = 0.0f;
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        float* dst = panel + k * nr;
        std::memcpy(dst, g.b + (k0 + k) * g.ldb + j0 + p, size_t(n) * sizeof(float));
        std::fill(dst + n, dst + nr, 0.0f);
      }
    }
  }
}

// Rows [i0, i0 + mc) and columns [k0, k0 + kc) of A (row stride lda) as micro-panels of mr
// rows: value k of row i of a micro-panel at [k·mr + i], zero rows past the last.
void pack_a(const float* a, int64_t lda, int64_t i0, int64_t mc, int64_t k0, int64_t kc,
            int64_t mr, float* pack) {
  for (int64_t r = 0; r < mc; r += mr) {
    const int64_t rows = std::min(mr, mc - r);
    float* panel = pack + r * kc;
    const float* src = a + (i0 + r) * lda + k0;
    for (int64_t k = 0; k < kc; ++k, panel += mr) {
      for (int64_t i = 0; i < rows; ++i) panel[i] = src[i * lda + k];
      for (int64_t i = rows; i < mr; ++i) panel[i] = 0.0f;
    }
  }
}

}  // namespace

size_t gemm_pack_floats() { return size_t(kPackB + kKc * kMc); }

// The whole of A packed for a_packed: the columns [k0, k0 + KC) of every row, KC block after
// KC block, each block holding M (rounded up to MR) rows as pack_a writes them.
size_t gemm_packed_a_floats(int64_t M, int64_t K, quant::Isa isa) {
  return size_t(round_up(M, kernel_for(isa).mr) * K);
}

void gemm_pack_a(const float* a, int64_t lda, int64_t M, int64_t K, quant::Isa isa, float* out) {
  const int64_t mr = kernel_for(isa).mr, rows = round_up(M, mr);
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    pack_a(a, lda, 0, M, k0, kc, mr, out + k0 * rows);
  }
}

void gemm_pack_a_rows(const float* rows, int64_t lda, int64_t i0, int64_t count, int64_t M,
                      int64_t K, quant::Isa isa, float* out) {
  const int64_t mr = kernel_for(isa).mr, all = round_up(M, mr);
  check(i0 % mr == 0 && i0 >= 0 && count >= 0 && i0 + count <= M &&
            (count % mr == 0 || i0 + count == M),
        "gemm_pack_a_rows: rows [", i0, ", ", i0 + count, ") of ", M, " in blocks of ", mr);
  for (int64_t k0 = 0; k0 < K; k0 += kKc) {
    const int64_t kc = std::min(kKc, K - k0);
    pack_a(rows, lda, 0, count, k0, kc, mr, out + k0 * all + i0 * kc);
  }
}

int64_t gemm_row_block(quant::Isa isa) { return kernel_for(isa).mr; }

void gemm(const GemmArgs& g, quant::Isa isa, float* pack) {
  check(g.M >= 0 && g.N >= 0 && g.K >= 0, "gemm: negative size");
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) {  // an empty sum
    if (!g.accumulate)
      for (int64_t i = 0; i < g.M; ++i) std::fill(g.c + i * g.ldc, g.c + i * g.ldc + g.N, 0.0f);
    return;
  }
  const GemmKernel kern = kernel_for(isa);
  const int64_t packed_rows = g.a_packed_rows > 0 ? g.a_packed_rows : g.M;
  check(!g.a_packed || (g.a_packed_row0 >= 0 && g.a_packed_row0 % kern.mr == 0 &&
                        g.a_packed_row0 + g.M <= packed_rows),
        "gemm: rows [", g.a_packed_row0, ", ", g.a_packed_row0 + g.M, ") of a packed A of ",
        packed_rows, " rows in blocks of ", kern.mr);
  float* const packed_b = pack;
  float* const packed_a = pack + kPackB;
  const int64_t kc_max = std::min(kKc, g.K);
  const int64_t nc_max = std::max<int64_t>(kern.nr, kPackB / kc_max / kern.nr * kern.nr);
  for (int64_t j0 = 0; j0 < g.N; j0 += nc_max) {
    const int64_t nc = std::min(nc_max, g.N - j0);
    for (int64_t k0 = 0; k0 < g.K; k0 += kKc) {
      const int64_t kc = std::min(kKc, g.K - k0);
      pack_b(g, k0, kc, j0, nc, kern, packed_b);
      detail::GemmMicroArgs m;
      m.kc = kc;
      m.ldc = g.ldc;
      m.alpha = g.alpha;
      m.accumulate = g.accumulate || k0 > 0;
      const bool packed = g.a_packed != nullptr;
      const bool pack_rows = !packed && g.N >= kPackAColumns;
      m.row = packed || pack_rows ? 1 : g.lda;
      m.step = packed || pack_rows ? kern.mr : 1;
      for (int64_t i0 = 0; i0 < g.M; i0 += kMc) {
        const int64_t mc = std::min(kMc, g.M - i0);
        if (pack_rows) pack_a(g.a, g.lda, i0, mc, k0, kc, kern.mr, packed_a);
        for (int64_t p = 0; p < nc; p += kern.nr) {
          m.n = std::min(kern.nr, nc - p);
          m.panel = packed_b + p * kc;
          for (int64_t r = 0; r < mc; r += kern.mr) {
            m.mr = std::min(kern.mr, mc - r);
            m.a = packed      ? g.a_packed + k0 * round_up(packed_rows, kern.mr) +
                                    (g.a_packed_row0 + i0 + r) * kc
                  : pack_rows ? packed_a + r * kc
                              : g.a + (i0 + r) * g.lda + k0;
            m.c = g.c + (i0 + r) * g.ldc + j0 + p;
            kern.micro(m);
          }
        }
      }
    }
  }
}

}  // namespace klein::ops
