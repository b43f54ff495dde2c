// Block formats: sizes, round-trip error per type, determinism, the two layouts, slices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/matmul.h"
#include "quant_testing.h"

namespace klein::quant {
namespace {

using testing::Packed;
using testing::random_matrix;

TEST(Blocks, StorageBytes) {
  EXPECT_EQ(storage_bytes(DType::F32, Layout::RowMajor, 3, 64), 3u * 64 * 4);
  EXPECT_EQ(storage_bytes(DType::BF16, Layout::RowMajor, 3, 64), 3u * 64 * 2);
  EXPECT_EQ(storage_bytes(DType::Q8, Layout::RowMajor, 3, 64), 3u * 2 * 34);
  EXPECT_EQ(storage_bytes(DType::Q4, Layout::RowMajor, 3, 64), 3u * 2 * 18);
  // Interleaved16 pads to whole groups of 16 rows: 8.5 and 4.5 bits per weight.
  EXPECT_EQ(storage_bytes(DType::Q8, Layout::Interleaved16, 17, 64), 2u * 2 * 544);
  EXPECT_EQ(storage_bytes(DType::Q4, Layout::Interleaved16, 16, 64), 1u * 2 * 288);
  EXPECT_EQ(storage_bytes(DType::Q8, Layout::Interleaved16, 16, 32) * 8, 16u * 32 * 8.5);
  EXPECT_EQ(storage_bytes(DType::Q4, Layout::Interleaved16, 16, 32) * 8, 16u * 32 * 4.5);
  EXPECT_THROW(storage_bytes(DType::Q8, Layout::RowMajor, 2, 48), Error);
  EXPECT_THROW(storage_bytes(DType::BF16, Layout::Interleaved16, 16, 64), Error);
  EXPECT_THROW(storage_bytes(DType::I32, Layout::RowMajor, 16, 64), Error);
}

TEST(Blocks, Q4ScaleCodes) {
  EXPECT_EQ(q4_scale(0), 0.0f);
  EXPECT_EQ(q4_scale_code(0.0f), 0);
  EXPECT_EQ(q4_scale_code(-1.0f), 0);
  EXPECT_EQ(q4_scale(kQ4MaxScaleCode), 240.0f);  // 1.875 * 2^15 * 2^-8
  EXPECT_EQ(q4_scale_code(1e9f), kQ4MaxScaleCode);
  for (int c = 1; c <= kQ4MaxScaleCode; ++c) {
    ASSERT_GT(q4_scale(uint8_t(c)), q4_scale(uint8_t(c - 1))) << c;
    ASSERT_EQ(q4_scale_code(q4_scale(uint8_t(c))), c);
  }
}

// Relative RMS error of quantize -> dequantize: sqrt(sum (w - w')^2 / sum w^2).
double roundtrip_rmse(DType type, const std::vector<float>& w, int64_t rows, int64_t cols) {
  Packed p(w.data(), rows, cols, type, Layout::RowMajor);
  std::vector<float> back(w.size());
  unpack_rows(p.matrix, 0, rows, back.data());
  double err = 0, ref = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    err += double(w[i] - back[i]) * double(w[i] - back[i]);
    ref += double(w[i]) * w[i];
  }
  return std::sqrt(err / ref);
}

// Stated bounds on Gaussian weights (measured values in the comments).
TEST(Blocks, RoundTripRmsePerType) {
  const int64_t rows = 64, cols = 1024;
  const std::vector<float> w = random_matrix(rows, cols, 1, testing::Dist::Gauss);
  EXPECT_EQ(roundtrip_rmse(DType::F32, w, rows, cols), 0.0);
  EXPECT_LT(roundtrip_rmse(DType::F16, w, rows, cols), 3e-4);   // 2^-11 / sqrt(3) ~ 2.8e-4
  EXPECT_LT(roundtrip_rmse(DType::BF16, w, rows, cols), 2.5e-3);  // 2^-8 / sqrt(3) ~ 2.3e-3
  EXPECT_LT(roundtrip_rmse(DType::Q8, w, rows, cols), 6e-3);     // ~5.3e-3
  EXPECT_LT(roundtrip_rmse(DType::Q4, w, rows, cols), 0.075);    // ~0.073
}

// A symmetric 4-bit block with an f16 scale (the same 4.5 bits per weight) and the best of
// 21 scales near max/8: the baseline the Q4 format has to beat to justify its zero point.
double symmetric_q4_rmse(const std::vector<float>& w) {
  double err = 0, ref = 0;
  for (size_t b = 0; b < w.size(); b += kBlock) {
    const float* x = &w[b];
    float signed_max = 0;
    for (int i = 0; i < kBlock; ++i)
      if (std::fabs(x[i]) > std::fabs(signed_max)) signed_max = x[i];
    double best = INFINITY;
    for (int s = -10; s <= 10; ++s) {
      const float d = f16_to_f32(f32_to_f16(signed_max / (-8.0f + 0.1f * float(s))));
      double e = 0;
      for (int i = 0; i < kBlock; ++i) {
        const int q = d != 0 ? std::clamp(int(round_even(x[i] / d)), -8, 7) : 0;
        e += double(x[i] - d * float(q)) * double(x[i] - d * float(q));
      }
      best = std::min(best, e);
    }
    err += best;
    for (int i = 0; i < kBlock; ++i) ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

TEST(Blocks, Q4ZeroPointBeatsSymmetricAtSameSize) {
  for (testing::Dist dist : {testing::Dist::Gauss, testing::Dist::Laplace, testing::Dist::StudentT3,
                             testing::Dist::ColumnScaled}) {
    const std::vector<float> w = random_matrix(32, 1024, 7, dist);
    const double ours = roundtrip_rmse(DType::Q4, w, 32, 1024);
    const double symmetric = symmetric_q4_rmse(w);
    // Measured: 11% lower (Gauss) to 25% lower (Student-t with 3 degrees of freedom).
    EXPECT_LT(ours, 0.92 * symmetric) << "distribution " << int(dist);
  }
}

TEST(Blocks, AdversarialBlocks) {
  std::vector<float> w(6 * kBlock, 0.0f);
  for (int i = 0; i < kBlock; ++i) {
    w[kBlock + i] = 0.37f;                     // constant
    w[2 * kBlock + i] = i == 5 ? 1000.0f : 0.01f;  // one outlier
    w[3 * kBlock + i] = -3e-7f * float(i);     // tiny magnitudes
    w[4 * kBlock + i] = 500.0f * float(i % 7 - 3);  // range 3000, near the Q4 limit of 3600
    w[5 * kBlock + i] = float(i % 16) - 7.0f;  // exactly 16 levels
  }
  for (DType type : {DType::Q8, DType::Q4}) {
    Packed p(w.data(), 1, int64_t(w.size()), type, Layout::RowMajor);
    std::vector<float> back(w.size());
    unpack_rows(p.matrix, 0, 1, back.data());
    for (int b = 0; b < 6; ++b) {
      double lo = 0, hi = 0, err = 0;
      for (int i = 0; i < kBlock; ++i) {
        lo = std::min(lo, double(w[b * kBlock + i]));
        hi = std::max(hi, double(w[b * kBlock + i]));
        err = std::max(err, double(std::fabs(w[b * kBlock + i] - back[b * kBlock + i])));
      }
      // Worst element error: half a step, Q8: max|w| / 254, Q4: (max - min) / 30, with 15%
      // slack for the rounded scale and the spacing of the smallest f16 scales.
      const double half_step = type == DType::Q8 ? std::max(-lo, hi) / 254 : (hi - lo) / 30;
      EXPECT_LE(err, 1.15 * half_step + 6e-8) << dtype_name(type) << " block " << b;
      if (b == 0) {
        EXPECT_EQ(err, 0.0) << "zeros must stay zeros";
      }
    }
  }
}

TEST(Pack, DeterministicAndLayoutsAgree) {
  const int64_t rows = 37, cols = 96;
  const std::vector<float> w = random_matrix(rows, cols, 3, testing::Dist::Gauss);
  for (DType type : {DType::Q8, DType::Q4}) {
    Packed a(w.data(), rows, cols, type, Layout::Interleaved16);
    Packed b(w.data(), rows, cols, type, Layout::Interleaved16);
    EXPECT_EQ(a.bytes, b.bytes) << dtype_name(type);
    Packed r(w.data(), rows, cols, type, Layout::RowMajor);
    std::vector<float> from_tiles(size_t(rows * cols)), from_rows(size_t(rows * cols));
    unpack_rows(a.matrix, 0, rows, from_tiles.data());
    unpack_rows(r.matrix, 0, rows, from_rows.data());
    EXPECT_EQ(from_tiles, from_rows) << dtype_name(type);
    // Packing 16-row pieces into the right offsets gives the same bytes.
    std::vector<uint8_t> pieces(a.bytes.size());
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      const int64_t r1 = std::min(rows, r0 + 16);
      pack(w.data() + r0 * cols, r1 - r0, cols, type, Layout::Interleaved16,
           pieces.data() + storage_bytes(type, Layout::Interleaved16, r0, cols));
    }
    EXPECT_EQ(pieces, a.bytes) << dtype_name(type);
  }
}

TEST(Slice, RowsMatchTheWholeMatrix) {
  const int64_t rows = 45, cols = 64;
  const std::vector<float> w = random_matrix(rows, cols, 5, testing::Dist::Gauss);
  for (auto [type, layout] : testing::all_formats()) {
    Packed p(w.data(), rows, cols, type, layout);
    std::vector<float> all(size_t(rows * cols));
    unpack_rows(p.matrix, 0, rows, all.data());
    const int64_t g = row_granularity(layout);
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{16, 32}, {32, 45}, {0, 16}, {16, 45}}) {
      const Matrix s = p.matrix.slice_rows(begin, end);
      ASSERT_EQ(s.rows, end - begin);
      ASSERT_EQ(s.nbytes, storage_bytes(type, layout, end - begin, cols));
      std::vector<float> part(size_t((end - begin) * cols));
      unpack_rows(s, 0, end - begin, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), all.begin() + begin * cols))
          << dtype_name(type) << " " << layout_name(layout) << " [" << begin << ", " << end << ")";
    }
    if (g > 1) {
      EXPECT_THROW(p.matrix.slice_rows(8, 16), Error);
      EXPECT_THROW(p.matrix.slice_rows(0, 20), Error);
    } else {
      EXPECT_NO_THROW(p.matrix.slice_rows(3, 7));
    }
    EXPECT_THROW(p.matrix.slice_rows(0, rows + 1), Error);
  }
}

}  // namespace
}  // namespace klein::quant

namespace klein::quant {
namespace {

// Blocks of the kinds the Q4 search meets: Gaussian and heavy-tailed weights at several
// scales, constant blocks, blocks with one outlier, tiny and huge values, zeros and signed
// zeros.
std::vector<float> q4_search_blocks(int count) {
  std::mt19937 rng(123);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::student_t_distribution<float> heavy(3.0f);
  std::vector<float> v(size_t(count) * kBlock);
  for (int b = 0; b < count; ++b) {
    float* x = v.data() + size_t(b) * kBlock;
    const float scale = std::pow(10.0f, float(b % 13) - 8.0f);  // 1e-8 .. 1e4
    for (int i = 0; i < kBlock; ++i) {
      switch (b % 7) {
        case 0: x[i] = normal(rng) * scale; break;
        case 1: x[i] = heavy(rng) * scale; break;
        case 2: x[i] = 0.75f * scale; break;                    // constant
        case 3: x[i] = i == 5 ? 40.0f * scale : normal(rng) * scale; break;
        case 4: x[i] = i % 3 == 0 ? 0.0f : (i % 3 == 1 ? -0.0f : normal(rng) * scale); break;
        case 5: x[i] = std::fabs(normal(rng)) * scale + 3.0f * scale; break;  // all positive
        default: x[i] = -std::fabs(heavy(rng)) * scale; break;                 // all negative
      }
    }
  }
  return v;
}

// The search as first written: one candidate at a time, the error in eight partial sums.
struct PlainChoice {
  uint8_t scale = 0, zero = 0;
};

float plain_error(const float* x, PlainChoice c) {
  const float d = q4_scale(c.scale);
  const float inv_d = d > 0 ? 1.0f / d : 0.0f, z = c.zero / 16.0f;
  float e[8] = {};
  for (int i = 0; i < kBlock; i += 8)
    for (int j = 0; j < 8; ++j) {
      const float v = x[i + j] * inv_d + z;
      const float q = round_even(0.5f * (std::fabs(v) - std::fabs(v - 15.0f) + 15.0f));
      const float r = d * (q - z);
      e[j] += (x[i + j] - r) * (x[i + j] - r);
    }
  return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

BlockQ4 plain_quantize_q4(const float* x) {
  const float lo = *std::min_element(x, x + kBlock), hi = *std::max_element(x, x + kBlock);
  PlainChoice best;
  if (!(lo == 0 && hi == 0)) {
    float best_err = INFINITY;
    auto consider = [&](PlainChoice c) {
      const float e = plain_error(x, c);
      if (e < best_err) {
        best_err = e;
        best = c;
      }
    };
    auto zero_for = [](float l, float d) {
      return uint8_t(round_even(std::clamp(-l / d * 16.0f, 0.0f, 255.0f)));
    };
    const float span = hi > lo ? hi - lo : std::max(std::fabs(lo), std::fabs(hi));
    const float lo_base = hi > lo ? lo : std::min(lo, 0.0f);
    for (int a = 0; a < 5; ++a)
      for (int b = 0; b < 5; ++b) {
        const float l = lo_base + span * 0.03f * float(a);
        const float width = span * (1.0f - 0.03f * float(a + b));
        const uint8_t code = std::max<uint8_t>(1, q4_scale_code(width / 15.0f));
        consider({code, zero_for(l, q4_scale(code))});
      }
    const PlainChoice centre = best;
    const float centre_d = q4_scale(centre.scale);
    for (int dc = -1; dc <= 1; ++dc) {
      const int code = std::clamp(int(centre.scale) + dc, 1, int(kQ4MaxScaleCode));
      const float d = q4_scale(uint8_t(code));
      const int z0 = int(round_even(std::clamp(float(centre.zero) * centre_d / d, 0.0f, 255.0f)));
      for (int dz = -2; dz <= 2; ++dz)
        if (dc != 0 || dz != 0) consider({uint8_t(code), uint8_t(std::clamp(z0 + dz, 0, 255))});
    }
  }
  BlockQ4 out{};
  out.scale = best.scale;
  out.zero = best.zero;
  const float d = q4_scale(best.scale);
  const float inv_d = d > 0 ? 1.0f / d : 0.0f, z = best.zero / 16.0f;
  for (int i = 0; i < kBlock / 2; ++i) {
    auto level = [&](float v) {
      return d > 0 ? int(round_even(std::clamp(v * inv_d + z, 0.0f, 15.0f))) : 0;
    };
    out.q[i] = uint8_t(level(x[i]) | (level(x[i + 16]) << 4));
  }
  return out;
}

// The search as dispatched, its scalar form, and (where the CPU has them) the AVX2 and AVX-512
// forms that set up (AVX-512: and choose) the candidates in lanes: all give the plain search's
// bytes.
TEST(Blocks, Q4SearchGivesTheBytesOfThePlainSearch) {
  const int count = 4000;
  const std::vector<float> v = q4_search_blocks(count);
  std::vector<std::pair<const char*, void (*)(const float*, BlockQ4*, int64_t)>> forms = {
      {"dispatched", quantize_q4}, {"scalar", quantize_q4_scalar}};
#if defined(KLEIN_X86)
  if (cpu_features().avx2) forms.push_back({"avx2", quantize_q4_avx2});
  if (cpu_features().avx512) forms.push_back({"avx512", quantize_q4_avx512});
#endif
  for (const auto& [form, quantize] : forms) {
    std::vector<BlockQ4> got(count);
    quantize(v.data(), got.data(), int64_t(count) * kBlock);
    int differ = 0;
    for (int b = 0; b < count; ++b) {
      const BlockQ4 want = plain_quantize_q4(v.data() + size_t(b) * kBlock);
      if (std::memcmp(&want, &got[size_t(b)], sizeof(BlockQ4)) != 0 && ++differ <= 3)
        ADD_FAILURE() << form << ", block " << b << ": scale/zero " << int(got[size_t(b)].scale) << "/"
                      << int(got[size_t(b)].zero) << ", plain search " << int(want.scale) << "/"
                      << int(want.zero);
    }
    EXPECT_EQ(differ, 0) << form;
  }
}

// Q8 on every ISA gives the scalar reference's bytes, on the search's varied blocks and on
// values that land exactly between two levels.
TEST(Blocks, Q8SameBytesOnEveryIsa) {
  std::vector<float> v = q4_search_blocks(3000);
  for (int i = 0; i < kBlock; ++i) v.push_back(float(i - 16) + 0.5f);  // ties, d = 16/127
  const int64_t n = int64_t(v.size());
  std::vector<BlockQ8> want(size_t(n / kBlock)), got(size_t(n / kBlock));
  quantize_q8_scalar(v.data(), want.data(), n);
  quantize_q8(v.data(), got.data(), n);
  for (size_t b = 0; b < want.size(); ++b)
    ASSERT_EQ(std::memcmp(&want[b], &got[b], sizeof(BlockQ8)), 0) << "block " << b;
#if defined(KLEIN_X86)
  if (cpu_features().avx512) {
    quantize_q8_avx512(v.data(), got.data(), n);
    for (size_t b = 0; b < want.size(); ++b)
      ASSERT_EQ(std::memcmp(&want[b], &got[b], sizeof(BlockQ8)), 0) << "avx512, block " << b;
  }
#endif
}

// Every vector form of the candidates' error gives the scalar reference's bits, for lists
// of every length (the vector tails) and candidates the search makes.
TEST(Blocks, Q4TrialErrorsSameBitsOnEveryIsa) {
  const std::vector<float> v = q4_search_blocks(700);
  std::mt19937 rng(9);
  int checked = 0;
  for (int b = 0; b < 700; ++b) {
    const float* x = v.data() + size_t(b) * kBlock;
    const int n = 1 + b % 32;
    float d[32], inv_d[32], z[32], want[32];
    for (int t = 0; t < n; ++t) {
      const uint8_t code = uint8_t(rng() % (kQ4MaxScaleCode + 1));
      d[t] = q4_scale(code);
      inv_d[t] = d[t] > 0 ? 1.0f / d[t] : 0.0f;
      z[t] = float(rng() % 256) / 16.0f;
    }
    q4_trial_errors_scalar(x, d, inv_d, z, n, want);
    auto same = [&](const float* got, const char* isa) {
      for (int t = 0; t < n; ++t)
        ASSERT_EQ(std::memcmp(&got[t], &want[t], 4), 0)
            << isa << ", block " << b << ", candidate " << t << ": " << got[t] << " vs " << want[t];
    };
    float got[32];
    q4_trial_errors(x, d, inv_d, z, n, got);
    same(got, "dispatched");
#if defined(KLEIN_X86)
    if (cpu_features().avx2) {
      q4_trial_errors_avx2(x, d, inv_d, z, n, got);
      same(got, "avx2");
      ++checked;
    }
    if (cpu_features().avx512) {
      q4_trial_errors_avx512(x, d, inv_d, z, n, got);
      same(got, "avx512");
      ++checked;
    }
#endif
  }
  RecordProperty("vector_forms_checked", checked);
}

}  // namespace
}  // namespace klein::quant
