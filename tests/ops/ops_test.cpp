#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "ops/attention.h"
#include "ops/finite.h"
#include "ops/gemm.h"
#include "ops/linear.h"
#include "ops/norm.h"
#include "quant/matmul.h"
#include "support/isa.h"
#include "attention_reference.h"

namespace klein::ops {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TEST(Linear, MatchesNaiveForEveryFloatType) {
  const int64_t M = 37, N = 70, K = 96;
  auto x = random_vector(size_t(M * K), 1);
  auto wf = random_vector(size_t(N * K), 2);
  std::vector<uint16_t> wb(wf.size()), wh(wf.size());
  f32_to_bf16(wf.data(), wb.data(), wf.size());
  f32_to_f16(wf.data(), wh.data(), wf.size());
  Compute cx(2);
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    Weight w{"w", t, {N, K}, nullptr, 0};
    std::vector<float> exact(wf.size());
    if (t == DType::F32) w.data = wf.data();
    if (t == DType::BF16) w.data = wb.data();
    if (t == DType::F16) w.data = wh.data();
    w.nbytes = size_t(N * K) * dtype_size(t);
    to_f32(t, w.data, exact.data(), exact.size());
    std::vector<float> y(size_t(M * N));
    linear(x.data(), M, w, y.data(), cx);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(x[size_t(m * K + k)]) * exact[size_t(n * K + k)];
        ASSERT_NEAR(y[size_t(m * N + n)], ref, 1e-4 * (1 + std::fabs(ref))) << dtype_name(t);
      }
  }
}

// With the context's arithmetic.float_on_tiles, float weights run on bf16 tiles (AMX CPUs):
// within the bf16 bound of the exact result, and exact again once it is switched off.
TEST(Linear, FloatWeightsOnTiles) {
  KLEIN_REQUIRE_ISA(quant::Isa::Amx);  // elsewhere float_on_tiles changes nothing
  const int64_t M = 70, N = 40, K = 160;
  auto x = random_vector(size_t(M * K), 5);
  auto wf = random_vector(size_t(N * K), 6);
  std::vector<uint16_t> wb(wf.size());
  f32_to_bf16(wf.data(), wb.data(), wf.size());
  std::vector<float> exact_w(wf.size());
  to_f32(DType::BF16, wb.data(), exact_w.data(), exact_w.size());
  const Weight w{"w", DType::BF16, {N, K}, wb.data(), wb.size() * 2};
  Compute cx(2);
  std::vector<float> before(size_t(M * N)), inside(size_t(M * N)), after(size_t(M * N));
  linear(x.data(), M, w, before.data(), cx);
  {
    const Compute::Use tiles(cx, {.float_on_tiles = true});
    linear(x.data(), M, w, inside.data(), cx);
  }
  linear(x.data(), M, w, after.data(), cx);
  EXPECT_EQ(before, after);
  bool differs = false;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double magnitude = 0;
      for (int64_t k = 0; k < K; ++k)
        magnitude += std::fabs(double(x[size_t(m * K + k)]) * exact_w[size_t(n * K + k)]);
      const double bound = (1.0 / 256 + 1.0 / (1 << 17) + double(K + 20) / (1 << 24)) * magnitude;
      const size_t i = size_t(m * N + n);
      ASSERT_LE(std::fabs(double(inside[i]) - double(before[i])), bound) << m << ", " << n;
      differs = differs || inside[i] != before[i];
    }
  }
  // On AMX the activations are rounded, so some output must change; elsewhere nothing does.
  EXPECT_EQ(differs, cx.amx());
}

TEST(Linear, RowSliceAndStridesAddressTheRightColumns) {
  const int64_t M = 3, N = 8, K = 4;
  auto x = random_vector(size_t(M * K), 3);
  auto wf = random_vector(size_t(N * K), 4);
  Weight w{"w", DType::F32, {N, K}, wf.data(), wf.size() * 4};
  Compute cx(1);
  std::vector<float> full(size_t(M * N)), wide(size_t(M * 10), -1.f);
  linear(x.data(), M, w, full.data(), cx);
  // Rows 2..5 of W written into columns 1..4 of a 10-wide buffer.
  linear(x.data(), M, K, weight_rows(w, 2, 6), wide.data() + 1, 10, cx);
  for (int64_t m = 0; m < M; ++m) {
    EXPECT_EQ(wide[size_t(m * 10)], -1.f);
    for (int64_t j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(wide[size_t(m * 10 + 1 + j)], full[size_t(m * N + 2 + j)]);
    EXPECT_EQ(wide[size_t(m * 10 + 5)], -1.f);
  }
}

// attention() and the float64 definition on random q, k, v (seeds seed..seed+2; q and k with
// standard deviation qk_sd, v with 1).
struct AttentionRun {
  std::vector<float> out, ref;
};
// `vector`: through attention_bf16_vector (the VDPBF16PS kernel whatever the CPU's speed).
AttentionRun run_attention(AttentionParams p, Compute& cx, const uint8_t* mask, uint32_t seed,
                           float qk_sd, bool vector = false) {
  p.key_valid = mask;
  auto q = random_vector(size_t(p.q_len * p.heads * p.head_dim), seed, qk_sd);
  auto k = random_vector(size_t(p.kv_len * p.kv_heads * p.head_dim), seed + 1, qk_sd);
  auto v = random_vector(size_t(p.kv_len * p.kv_heads * p.head_dim), seed + 2);
  AttentionRun r{std::vector<float>(q.size(), 123.f), {}};
  const int64_t wq = p.heads * p.head_dim, wk = p.kv_heads * p.head_dim;
  if (vector)
    attention_bf16_vector(q.data(), wq, k.data(), wk, v.data(), wk, r.out.data(), wq, p, cx);
  else
    attention(q.data(), wq, k.data(), wk, v.data(), wk, r.out.data(), wq, p, cx);
  r.ref = naive_attention(q, k, v, p);
  return r;
}

// SwiGLU against silu(g)·u in double, on every instruction set (the x86 ones share a
// polynomial exp), including a ragged tail, values past the polynomial's clamps, zeros and
// tiny values, and the in-place form the text encoder uses (out == gate).
class Activations : public klein::testing::OnEveryIsa {};

TEST_P(Activations, SwigluMatchesDouble) {
  std::vector<float> gate, up;
  for (float g : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-3f, 1.0f, -1.0f, 20.0f, -20.0f, 86.0f, -86.0f,
                  88.0f, -88.0f, 90.0f, -90.0f, 100.0f, -100.0f, 1e30f, -1e30f}) {
    gate.push_back(g);
    up.push_back(1.0f);
  }
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f), narrow(-2.0f, 2.0f);
  while (gate.size() < 1003) {  // not a multiple of 8 lanes
    gate.push_back(gate.size() % 2 ? wide(rng) : narrow(rng));
    up.push_back(narrow(rng));
  }
  const int64_t n = int64_t(gate.size());
  {
    const quant::Isa isa = this->isa();
    Compute cx(1, isa);
    std::vector<float> out(gate.size() + 1, 7.0f), in_place = gate;
    swiglu(gate.data(), up.data(), out.data(), n, cx);
    swiglu(in_place.data(), up.data(), in_place.data(), n, cx);
    EXPECT_EQ(out[size_t(n)], 7.0f) << quant::isa_name(isa) << " wrote past the end";
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[size_t(i)];
      const double ref = g / (1.0 + std::exp(-g)) * up[size_t(i)];
      const double tol = 4e-7 * std::fabs(ref) + 1e-36;  // g < -88 may give 0
      ASSERT_NEAR(out[size_t(i)], ref, tol) << quant::isa_name(isa) << " at gate " << g;
      ASSERT_EQ(in_place[size_t(i)], out[size_t(i)]) << quant::isa_name(isa) << " in place";
    }
  }
}

// ops::gemm on every instruction set the CPU has, against a float64 sum: every edge of the
// micro-kernels (rows and columns not multiples of MR and NR, K across the KC blocks, one
// row, one column), both forms of B, alpha, accumulation, and strided operands. The sums are
// float32 with fused multiply-adds, so the bound is K float32 roundings of the partial sums.
class Gemm : public klein::testing::OnEveryIsa {};

TEST_P(Gemm, MatchesFloat64OnEveryEdge) {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1},    {1, 37, 5},   {13, 1, 300}, {6, 16, 7},   {12, 32, 33},
                          {7, 17, 256}, {25, 70, 257}, {64, 300, 128}, {300, 9, 600}, {3, 520, 40}};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  {
    const quant::Isa isa = this->isa();
    std::vector<float> pack(gemm_pack_floats());
    for (const Shape& s : shapes)
      for (bool transposed : {false, true})
        for (bool accumulate : {false, true}) {
          const int64_t lda = s.K + 3, ldb = (transposed ? s.K : s.N) + 5, ldc = s.N + 2;
          std::vector<float> a(size_t(s.M * lda)), b(size_t((transposed ? s.N : s.K) * ldb)),
              c(size_t(s.M * ldc));
          for (auto* v : {&a, &b, &c})
            for (float& x : *v) x = d(rng);
          // Without accumulation C is not read: NaN there must not show.
          if (!accumulate) std::fill(c.begin(), c.end(), std::nanf(""));
          const std::vector<float> c0 = c;
          GemmArgs g;
          g.M = s.M;
          g.N = s.N;
          g.K = s.K;
          g.a = a.data();
          g.lda = lda;
          g.b = b.data();
          g.ldb = ldb;
          g.b_transposed = transposed;
          g.c = c.data();
          g.ldc = ldc;
          g.alpha = 0.75f;
          g.accumulate = accumulate;
          gemm(g, isa, pack.data());
          // A packed beforehand (a convolution's weights): the same sums, bit for bit.
          std::vector<float> packed_a(gemm_packed_a_floats(s.M, s.K, isa)), again = c0;
          gemm_pack_a(a.data(), lda, s.M, s.K, isa, packed_a.data());
          GemmArgs h = g;
          h.a = nullptr;
          h.a_packed = packed_a.data();
          h.c = again.data();
          gemm(h, isa, pack.data());
          ASSERT_EQ(std::memcmp(again.data(), c.data(), c.size() * sizeof(float)), 0)
              << quant::isa_name(isa) << " " << s.M << "x" << s.N << "x" << s.K
              << ": packed A gives other values";
          // Rows from the second row block on, taken from the same packed A alone.
          const int64_t mr = gemm_row_block(isa);
          if (s.M > mr) {
            std::vector<float> tail = c0;
            GemmArgs r = h;
            r.M = s.M - mr;
            r.a_packed_row0 = mr;
            r.a_packed_rows = s.M;
            r.c = tail.data() + mr * ldc;
            gemm(r, isa, pack.data());
            ASSERT_EQ(std::memcmp(tail.data() + mr * ldc, c.data() + mr * ldc,
                                  (c.size() - size_t(mr * ldc)) * sizeof(float)),
                      0)
                << quant::isa_name(isa) << " " << s.M << "x" << s.N << "x" << s.K
                << ": rows of a packed A give other values";
          }
          // Columns [1, N) alone: the panels end elsewhere, the values stay the same, bit for
          // bit (alpha != 1 and accumulation included).
          if (s.N > 1) {
            std::vector<float> shifted = c0;
            GemmArgs t = g;
            t.N = s.N - 1;
            t.b = transposed ? b.data() + ldb : b.data() + 1;
            t.c = shifted.data() + 1;
            gemm(t, isa, pack.data());
            for (int64_t i = 0; i < s.M; ++i)
              ASSERT_EQ(std::memcmp(&shifted[size_t(i * ldc + 1)], &c[size_t(i * ldc + 1)],
                                    size_t(s.N - 1) * sizeof(float)),
                        0)
                  << quant::isa_name(isa) << " " << s.M << "x" << s.N << "x" << s.K
                  << ": a column's value depends on where the panels end (row " << i << ")";
          }
          for (int64_t i = 0; i < s.M; ++i) {
            for (int64_t j = 0; j < s.N; ++j) {
              double sum = 0, magnitude = 0;
              for (int64_t k = 0; k < s.K; ++k) {
                const double x = a[size_t(i * lda + k)];
                const double y = transposed ? b[size_t(j * ldb + k)] : b[size_t(k * ldb + j)];
                sum += x * y;
                magnitude += std::fabs(x * y);
              }
              const double want = 0.75 * sum + (accumulate ? c0[size_t(i * ldc + j)] : 0.0);
              const double tol = 0.75 * magnitude * double(s.K) * 6e-8 + 1e-6;
              ASSERT_NEAR(c[size_t(i * ldc + j)], want, tol)
                  << quant::isa_name(isa) << " " << s.M << "x" << s.N << "x" << s.K
                  << (transposed ? " B transposed" : "") << (accumulate ? " accumulate" : "")
                  << " at (" << i << ", " << j << ")";
            }
            // Nothing written outside the N columns of a row (the padding of ldc).
            for (int64_t j = s.N; j < ldc; ++j)
              ASSERT_TRUE(std::memcmp(&c[size_t(i * ldc + j)], &c0[size_t(i * ldc + j)],
                                      sizeof(float)) == 0)
                  << quant::isa_name(isa) << " wrote column " << j << " of row " << i;
          }
        }
  }
}

// On every instruction set the CPU has (each has its own softmax kernel; each logged as run).
void expect_attention_matches(AttentionParams p, int threads, const uint8_t* mask = nullptr,
                              bool bf16 = false) {
  for (quant::Isa isa : quant::available_isas()) {
    klein::testing::isa_runs(isa);
    Compute cx(threads, isa);
    cx.arithmetic.bf16_attention = bf16;
    const AttentionRun r = run_attention(p, cx, mask, 5, 2.f);
    for (size_t i = 0; i < r.out.size(); ++i)
      ASSERT_NEAR(r.out[i], r.ref[i], 2e-5) << quant::isa_name(isa) << " at " << i;
  }
}

TEST(Attention, MatchesNaiveAcrossTileBoundaries) {
  AttentionParams p;
  p.q_len = 300;  // not a multiple of the 256-row query tile
  p.kv_len = 600; // one key chunk (ExactPathAcrossKeyChunks has several)
  p.heads = 2;
  p.kv_heads = 2;
  p.head_dim = 32;
  p.scale = 1.0f / std::sqrt(32.0f);
  expect_attention_matches(p, 1);
  expect_attention_matches(p, 2);
}

TEST(Attention, CausalWithPaddingMaskAndGroupedHeads) {
  AttentionParams p;
  p.q_len = p.kv_len = 130;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 16;
  p.scale = 0.25f;
  p.causal = true;
  std::vector<uint8_t> valid(130, 1);
  for (int j = 100; j < 130; ++j) valid[size_t(j)] = 0;  // right padding, as in the text encoder
  expect_attention_matches(p, 2, valid.data());
}

// Queries that follow cached keys (a language model's pass after kept positions): query i sees
// keys 0 .. i + causal_offset, across key chunks and query tiles.
TEST(Attention, CausalAfterCachedKeys) {
  AttentionParams p;
  p.q_len = 300;
  p.kv_len = 1900;  // 1600 cached keys, then the 300 of the queries
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 32;
  p.scale = 1.0f / std::sqrt(32.0f);
  p.causal = true;
  p.causal_offset = 1600;
  expect_attention_matches(p, 2);
  p.q_len = 5;  // a few tokens after a long prefix
  p.kv_len = 1605;
  expect_attention_matches(p, 1);
}

TEST(Attention, ExactPathAcrossKeyChunks) {
  AttentionParams p;
  p.q_len = 70;
  p.kv_len = 2100;  // three key chunks of 704, 704 and 692
  p.heads = 3;
  p.kv_heads = 1;
  p.head_dim = 40;
  p.scale = 1.0f / std::sqrt(40.0f);
  expect_attention_matches(p, 2);
  p.causal = true;
  p.q_len = 2100;
  p.heads = 1;
  std::vector<uint8_t> valid(2100, 1);
  for (int j = 0; j < 2100; j += 7) valid[size_t(j)] = 0;
  expect_attention_matches(p, 2, valid.data());
}

// The bf16 path against float64 attention: max |out - ref| / max |ref| for q, k, v drawn
// from N(0, 1) with scale 1/sqrt(head_dim), the shape of the model's attention inputs after
// the q/k norms. Run on AMX tiles (isa amx: attention() must choose them) and with VDPBF16PS
// (isa avx512: attention_bf16_vector, which attention() chooses only where VDPBF16PS is fast);
// each run must show bf16 rounding (an error above the float32 path's ~1e-6), so that a
// fallback to the exact path fails.
double bf16_attention_error(AttentionParams p, quant::Isa isa, int threads,
                            const uint8_t* mask = nullptr) {
  Compute cx(threads, isa);
  cx.arithmetic.bf16_attention = true;
  const bool vector = isa != quant::Isa::Amx;
  if (!vector) {
    EXPECT_TRUE(uses_bf16_attention(p, cx));
  }
  const auto [out, ref] = run_attention(p, cx, mask, 11, 1.f, vector);
  double max_ref = 0, max_err = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(std::isfinite(out[i])) << "at " << i;
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
    max_err = std::max(max_err, std::fabs(double(out[i]) - ref[i]));
  }
  const double rel = max_err / std::max(max_ref, 1e-30);
  std::printf("    bf16 attention (%s) q_len %lld kv_len %lld heads %lld/%lld dim %lld%s%s: "
              "max error %.2e of max|ref| %.3f\n",
              std::string(quant::isa_name(isa)).c_str(), (long long)p.q_len, (long long)p.kv_len,
              (long long)p.heads, (long long)p.kv_heads, (long long)p.head_dim,
              p.causal ? " causal" : "", mask ? " masked" : "", rel, max_ref);
  EXPECT_GT(rel, 1e-4) << "no bf16 rounding: the exact path ran";
  return rel;
}

constexpr double kBf16Bound = 2e-2;

AttentionParams bf16_params(int64_t q_len, int64_t kv_len, int64_t heads, int64_t kv_heads,
                            int64_t head_dim) {
  AttentionParams p;
  p.q_len = q_len;
  p.kv_len = kv_len;
  p.heads = heads;
  p.kv_heads = kv_heads;
  p.head_dim = head_dim;
  p.scale = float(1.0 / std::sqrt(double(head_dim)));
  return p;
}

// The two bf16 kernels: AMX tiles, and VDPBF16PS (avx512 with AVX-512 BF16).
class AttentionBf16 : public ::testing::TestWithParam<quant::Isa> {
 protected:
  void SetUp() override {
    KLEIN_REQUIRE_ISA(isa());
    if (isa() == quant::Isa::Avx512) {
      KLEIN_REQUIRE_PATH(cpu_features().avx512_bf16, "avx512-bf16-attention",
                         "the CPU has no AVX-512 BF16: " + describe(cpu_features()));
    }
  }
  quant::Isa isa() const { return GetParam(); }
};

TEST_P(AttentionBf16, OddSizesMatchDoublePrecision) {
  // Neither length a multiple of 16 or 32; more query rows than one 128-row task.
  EXPECT_LE(bf16_attention_error(bf16_params(141, 77, 3, 3, 128), isa(), 2), kBf16Bound);
  EXPECT_LE(bf16_attention_error(bf16_params(77, 141, 2, 2, 64), isa(), 1), kBf16Bound);
  // One query row, one key (one key: the softmax is 1 whatever the scores, only V's rounding).
  EXPECT_LE(bf16_attention_error(bf16_params(1, 50, 2, 2, 128), isa(), 2), kBf16Bound);
  EXPECT_LE(bf16_attention_error(bf16_params(5, 1, 1, 1, 32), isa(), 1), kBf16Bound);
}

TEST_P(AttentionBf16, ManyKeyChunks) {
  // 2500 keys: three chunks of 864, 864 and 772, the online softmax rescaling across them.
  EXPECT_LE(bf16_attention_error(bf16_params(200, 2500, 2, 2, 128), isa(), 2), kBf16Bound);
}

TEST_P(AttentionBf16, CausalMaskedGroupedHeads) {
  // The text encoder's case: GQA, causal, right padding hidden.
  AttentionParams p = bf16_params(130, 130, 8, 2, 128);
  p.causal = true;
  std::vector<uint8_t> valid(130, 1);
  for (int j = 100; j < 130; ++j) valid[size_t(j)] = 0;
  EXPECT_LE(bf16_attention_error(p, isa(), 2, valid.data()), kBf16Bound);
  // Causal across key chunks, with the first keys hidden too (row 0 sees nothing: zeros).
  p = bf16_params(1100, 1100, 2, 1, 64);
  p.causal = true;
  std::vector<uint8_t> valid2(1100, 1);
  valid2[0] = valid2[1] = 0;
  EXPECT_LE(bf16_attention_error(p, isa(), 2, valid2.data()), kBf16Bound);
  // Queries after cached keys: 200 of them after 1000, across key chunks and tasks.
  p = bf16_params(200, 1200, 4, 2, 64);
  p.causal = true;
  p.causal_offset = 1000;
  EXPECT_LE(bf16_attention_error(p, isa(), 2), kBf16Bound);
}

TEST_P(AttentionBf16, StridedRows) {
  // Inputs inside wider rows, as when q, k and v come out of one fused projection.
  AttentionParams p = bf16_params(50, 60, 2, 2, 64);
  const int64_t W = 3 * 2 * 64, D = 2 * 64;
  auto qkv = random_vector(size_t(60 * W), 21);
  std::vector<float> out(size_t(50 * (D + 8)), 7.f), q, k, v;
  for (int64_t i = 0; i < 60; ++i)
    for (int64_t d = 0; d < D; ++d) {
      if (i < 50) q.push_back(qkv[size_t(i * W + d)]);
      k.push_back(qkv[size_t(i * W + D + d)]);
      v.push_back(qkv[size_t(i * W + 2 * D + d)]);
    }
  Compute cx(2, isa());
  cx.arithmetic.bf16_attention = true;
  if (isa() == quant::Isa::Amx) {
    ASSERT_TRUE(uses_bf16_attention(p, cx));
    attention(qkv.data(), W, qkv.data() + D, W, qkv.data() + 2 * D, W, out.data(), D + 8, p, cx);
  } else {
    attention_bf16_vector(qkv.data(), W, qkv.data() + D, W, qkv.data() + 2 * D, W, out.data(),
                          D + 8, p, cx);
  }
  auto ref = naive_attention(q, k, v, p);
  for (int64_t i = 0; i < 50; ++i) {
    for (int64_t d = 0; d < D; ++d)
      ASSERT_NEAR(out[size_t(i * (D + 8) + d)], ref[size_t(i * D + d)], 2e-2) << i << "," << d;
    for (int64_t d = D; d < D + 8; ++d) ASSERT_EQ(out[size_t(i * (D + 8) + d)], 7.f);
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionBf16,
                         ::testing::Values(quant::Isa::Amx, quant::Isa::Avx512),
                         klein::testing::isa_param_name);

// Where both run: the VDPBF16PS kernel and the tiles round the same values to bf16 and differ
// only in the order of their float32 additions (which can put a score on the other side of a
// bf16 rounding of P: a few 1e-5 of max|out|); a wrong layout gives errors near 1.
TEST(AttentionBf16Paths, VectorAndTileKernelsAgree) {
  KLEIN_REQUIRE_ISA(quant::Isa::Amx);
  AttentionParams p = bf16_params(141, 300, 4, 2, 128);
  p.causal = true;
  Compute amx(2, quant::Isa::Amx), vec(2, quant::Isa::Avx512);
  amx.arithmetic.bf16_attention = vec.arithmetic.bf16_attention = true;
  const AttentionRun a = run_attention(p, amx, nullptr, 31, 1.f);
  const AttentionRun b = run_attention(p, vec, nullptr, 31, 1.f, /*vector=*/true);
  double max_a = 0, max_diff = 0;
  for (size_t i = 0; i < a.out.size(); ++i) {
    max_a = std::max(max_a, std::fabs(double(a.out[i])));
    max_diff = std::max(max_diff, std::fabs(double(a.out[i]) - double(b.out[i])));
  }
  std::printf("    amx against avx512-bf16: %.2e of max|out|\n", max_diff / max_a);
  EXPECT_LT(max_diff / max_a, 2e-4);
}

// Where VDPBF16PS is slower than FMA (Intel), attention() keeps an AVX-512 context on the exact
// path even when asked for bf16; where it is faster (AMD), it takes the vector kernel.
TEST(AttentionBf16Paths, VectorKernelOnlyWhereItIsFaster) {
  KLEIN_REQUIRE_ISA(quant::Isa::Avx512);
  Compute cx(1, quant::Isa::Avx512);
  cx.arithmetic.bf16_attention = true;
  EXPECT_EQ(uses_bf16_attention(bf16_params(64, 64, 2, 2, 128), cx),
            cpu_features().avx512_bf16_fast);
}

// Asked for on every CPU: head_dim 48 is not a multiple of 32, so the exact path runs, to its
// own tolerance.
TEST(AttentionBf16Exact, UnsupportedHeadDimRunsTheExactPath) {
  const AttentionParams p = bf16_params(40, 45, 2, 1, 48);
  Compute cx(2);
  cx.arithmetic.bf16_attention = true;
  EXPECT_FALSE(uses_bf16_attention(p, cx));
  expect_attention_matches(p, 2, nullptr, /*bf16=*/true);
}

TEST(Norm, LayerNormAndRmsNorm) {
  Compute cx(1);
  std::vector<float> x = {1, 2, 3, 4}, y(4), w = {1, 2, 1, 1};
  layer_norm(x.data(), y.data(), 1, 4, 0.0f, cx);
  const float sd = std::sqrt(1.25f);
  EXPECT_NEAR(y[0], -1.5f / sd, 1e-6);
  EXPECT_NEAR(y[3], 1.5f / sd, 1e-6);
  rms_norm(x.data(), y.data(), 1, 4, w.data(), 0.0f, cx);
  const float rms = std::sqrt(30.0f / 4);
  EXPECT_NEAR(y[1], 2 * 2 / rms, 1e-6);
}

// Rows as wide as the models' (and an odd width for the tail), values far from zero with a
// small spread (layer_norm's variance must not cancel away): both norms within 2 float32 ulps
// of the same formulas computed one value at a time in long double.
TEST(Norm, WideRowsMatchALongDoubleReference) {
  Compute cx(2);
  for (int64_t dim : {3072, 131, 8}) {
    const int64_t rows = 5;
    std::vector<float> x(static_cast<size_t>(rows * dim)), w(static_cast<size_t>(dim));
    std::vector<float> y(x.size()), z(x.size());
    auto ulp = [](float v) { return std::nextafter(std::fabs(v), INFINITY) - std::fabs(v); };
    uint32_t state = 12345;
    auto next = [&state] {
      state = state * 1664525u + 1013904223u;
      return float(state >> 8) / float(1 << 24) - 0.5f;
    };
    for (float& v : x) v = 1000.0f + next();
    for (float& v : w) v = 1.0f + next();
    layer_norm(x.data(), y.data(), rows, dim, 1e-6f, cx);
    rms_norm(x.data(), z.data(), rows, dim, w.data(), 1e-6f, cx);
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = x.data() + r * dim;
      long double sum = 0, sq = 0, sq0 = 0;
      for (int64_t i = 0; i < dim; ++i) sum += in[i];
      const long double mean = sum / dim;
      for (int64_t i = 0; i < dim; ++i) {
        sq += (in[i] - mean) * (in[i] - mean);
        sq0 += (long double)in[i] * in[i];
      }
      const float inv = float(1.0L / std::sqrt(sq / dim + 1e-6L));
      const float inv0 = float(1.0L / std::sqrt(sq0 / dim + 1e-6L));
      for (int64_t i = 0; i < dim; ++i) {
        const float ln = (in[i] - float(mean)) * inv, rms = w[size_t(i)] * (in[i] * inv0);
        const float got_ln = y[size_t(r * dim + i)], got_rms = z[size_t(r * dim + i)];
        ASSERT_LE(std::fabs(got_ln - ln), 2 * ulp(ln))
            << "layer_norm dim " << dim << " row " << r << " column " << i;
        ASSERT_LE(std::fabs(got_rms - rms), 2 * ulp(rms))
            << "rms_norm dim " << dim << " row " << r << " column " << i;
      }
    }
  }
}

// adaLN in one pass is layer_norm and then the modulation, bit for bit.
TEST(Norm, ModulatedLayerNormIsLayerNormThenModulation) {
  Compute cx(2);
  const int64_t rows = 7, dim = 3072 + 5;
  std::vector<float> x(static_cast<size_t>(rows * dim)), scale(static_cast<size_t>(dim));
  std::vector<float> shift(scale.size()), y(x.size()), z(x.size());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = 3.0f * normal(rng) + 0.5f;
  for (float& v : scale) v = 0.1f * normal(rng);
  for (float& v : shift) v = normal(rng);
  modulated_layer_norm(x.data(), y.data(), rows, dim, 1e-6f, scale.data(), shift.data(), cx);
  layer_norm(x.data(), z.data(), rows, dim, 1e-6f, cx);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < dim; ++i) {
      float& v = z[size_t(r * dim + i)];
      v = (1.0f + scale[size_t(i)]) * v + shift[size_t(i)];
    }
  EXPECT_EQ(0, std::memcmp(y.data(), z.data(), y.size() * sizeof(float)));
}

// Every NaN and infinity is found wherever it sits (the first value, inside a chunk, the
// last one), and the largest, smallest and signed-zero finite values pass.
TEST(Finite, FindsEveryNonFiniteValueAndPassesEveryFiniteOne) {
  Compute cx(2);
  const int64_t n = 20011;  // several chunks of 4096 and a ragged end
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 97) - 48.0f;
  x[1] = std::numeric_limits<float>::max();
  x[2] = -std::numeric_limits<float>::max();
  x[3] = std::numeric_limits<float>::denorm_min();
  x[4] = -0.0f;
  EXPECT_TRUE(all_finite(x.data(), n, cx));
  EXPECT_NO_THROW(require_finite(x.data(), n, "test", cx));
  using limits = std::numeric_limits<float>;
  const float bad[] = {limits::quiet_NaN(), -limits::quiet_NaN(), limits::infinity(),
                       -limits::infinity()};
  for (float v : bad) {
    for (int64_t at : {int64_t(0), int64_t(4095), int64_t(4096), int64_t(12345), n - 1}) {
      std::vector<float> y = x;
      y[size_t(at)] = v;
      EXPECT_FALSE(all_finite(y.data(), n, cx)) << v << " at " << at;
      try {
        require_finite(y.data(), n, "the test's values", cx);
        ADD_FAILURE() << "require_finite let " << v << " at " << at << " pass";
      } catch (const NonFinite& e) {
        EXPECT_NE(std::string(e.what()).find("value " + std::to_string(at) + " is"),
                  std::string::npos) << e.what();
      }
    }
  }
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(Activations);
KLEIN_INSTANTIATE_ON_EVERY_ISA(Gemm);

}  // namespace
}  // namespace klein::ops
