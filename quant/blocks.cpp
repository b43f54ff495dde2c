#include "quant/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/cpu.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace klein::quant {

namespace {

// v rounded to the nearest integer in [lo, hi]; clamping first keeps the conversion defined
// for any float.
inline int round_clamped(float v, int lo, int hi) {
  return int(round_even(std::clamp(v, float(lo), float(hi))));
}

// The level of x: round(clamp(x / d + z, 0, 15)).
inline int q4_level(float x, float inv_d, float z) { return round_clamped(x * inv_d + z, 0, 15); }

// ---- Q4 search ------------------------------------------------------------------------------

// The scale code of d given scaled = d / kQ4ScaleFactor (= d * 256) and h, its f16 bits.
// Codes are the f16 bit patterns of d * 256 with the low 7 bits dropped; rounding the bit
// pattern at bit 7 rounds to the nearest code within a binade.
inline uint8_t q4_code_of_half(float scaled, uint16_t h) {
  if (!(scaled > 0)) return 0;
  if (h >= 0x7c00) return kQ4MaxScaleCode;
  return uint8_t(std::min((h + 64) >> 7, int(kQ4MaxScaleCode)));
}

struct Q4Choice {
  uint8_t scale = 0;
  uint8_t zero = 0;
};


// A list of (scale code, zero code) candidates for one block, with the values the error
// needs; filled by the search, measured all at once by q4_trial_errors.
struct Q4Trials {
  static constexpr int kMax = 32;
  uint8_t scale[kMax], zero[kMax];
  float d[kMax], inv_d[kMax], z[kMax], err[kMax];
  int n = 0;

  void add(uint8_t scale_code, uint8_t zero_code, const Q4ScaleTable& t) {
    scale[n] = scale_code;
    zero[n] = zero_code;
    d[n] = t.d[scale_code];
    inv_d[n] = t.inv_d[scale_code];
    z[n] = zero_code / 16.0f;
    ++n;
  }
  void measure(const float* x) { q4_trial_errors(x, d, inv_d, z, n, err); }
};

// The zero code that puts `lo` on level 0 for scale d.
uint8_t q4_zero_for(float lo, float d) {
  return uint8_t(round_clamped(-lo / d * 16.0f, 0, 255));
}

// Picks (scale, zero) for one block by trying ranges [lo', hi'] slightly inside [min, max]
// (clipping the extremes often lowers the total error), then refining the best choice by
// one scale code and two zero steps either way. 40 trials; an exhaustive search over 729
// trials finds choices only 0.5% better in RMS error.
Q4Choice choose_q4(const float* x) {
  // The least and greatest values (x is finite; which zero a min or max of +0 and -0 gives
  // does not change the choice: lo reaches the result only through lo + 0, and hi - lo).
  float lo, hi;
#if defined(__SSE2__)
  __m128 vlo = _mm_loadu_ps(x), vhi = vlo;
  for (int i = 4; i < kBlock; i += 4) {
    const __m128 v = _mm_loadu_ps(x + i);
    vlo = _mm_min_ps(vlo, v);
    vhi = _mm_max_ps(vhi, v);
  }
  vlo = _mm_min_ps(vlo, _mm_movehl_ps(vlo, vlo));
  vhi = _mm_max_ps(vhi, _mm_movehl_ps(vhi, vhi));
  lo = _mm_cvtss_f32(_mm_min_ss(vlo, _mm_shuffle_ps(vlo, vlo, 1)));
  hi = _mm_cvtss_f32(_mm_max_ss(vhi, _mm_shuffle_ps(vhi, vhi, 1)));
#else
  lo = hi = x[0];
  for (int i = 1; i < kBlock; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
#endif
  if (lo == 0 && hi == 0) return {};
  const Q4ScaleTable& scales = q4_scale_table();
  Q4Choice best;
  float best_err = INFINITY;
  // The first candidate with the least error wins (in the order they were added).
  auto pick = [&](const Q4Trials& t) {
    for (int i = 0; i < t.n; ++i)
      if (t.err[i] < best_err) {
        best_err = t.err[i];
        best = {t.scale[i], t.zero[i]};
      }
  };
  // A constant block has no range: span it from zero instead.
  const float span = hi > lo ? hi - lo : std::max(std::fabs(lo), std::fabs(hi));
  const float lo_base = hi > lo ? lo : std::min(lo, 0.0f);
  constexpr int kSteps = 5;
  constexpr float kShrink = 0.03f;
  // The range [l, l + width] of trial (a, b) starts a steps in and is a + b steps narrower:
  // its scale code depends on a + b only (9 codes for the 25 trials).
  // Codes as q4_scale_code gives them, with the f16 rounding done by one bulk conversion
  // (F16C where the CPU has it; the same bits as the scalar one).
  constexpr int kWidths = 2 * kSteps - 1;
  float scaled[kWidths];
  uint16_t half_bits[kWidths];
  for (int ab = 0; ab < kWidths; ++ab) {
    const float width = span * (1.0f - kShrink * float(ab));
    scaled[ab] = width / 15.0f / kQ4ScaleFactor;
  }
  f32_to_f16(scaled, half_bits, kWidths);
  uint8_t width_code[kWidths];
  for (int ab = 0; ab < kWidths; ++ab)
    width_code[ab] = std::max<uint8_t>(1, q4_code_of_half(scaled[ab], half_bits[ab]));
  Q4Trials ranges;
  for (int a = 0; a < kSteps; ++a) {
    const float l = lo_base + span * kShrink * float(a);
    for (int b = 0; b < kSteps; ++b) {
      const uint8_t code = width_code[a + b];
      ranges.add(code, q4_zero_for(l, scales.d[code]), scales);
    }
  }
  ranges.measure(x);
  pick(ranges);
  const Q4Choice centre = best;
  const float centre_d = scales.d[centre.scale];
  Q4Trials around;
  for (int dc = -1; dc <= 1; ++dc) {
    const int code = std::clamp(int(centre.scale) + dc, 1, int(kQ4MaxScaleCode));
    const float d = scales.d[code];
    // Keep the zero point at the same place in value space when the scale changes.
    const int z0 = round_clamped(float(centre.zero) * centre_d / d, 0, 255);
    for (int dz = -2; dz <= 2; ++dz) {
      if (dc == 0 && dz == 0) continue;
      around.add(uint8_t(code), uint8_t(std::clamp(z0 + dz, 0, 255)), scales);
    }
  }
  around.measure(x);
  pick(around);
  return best;
}

}  // namespace

const Q4ScaleTable& q4_scale_table() {
  static const Q4ScaleTable table = [] {
    Q4ScaleTable t;
    for (int c = 0; c < 256; ++c) {
      t.d[c] = q4_scale(uint8_t(c));
      t.inv_d[c] = t.d[c] > 0 ? 1.0f / t.d[c] : 0.0f;
    }
    return t;
  }();
  return table;
}

uint8_t q4_scale_code(float d) {
  const float scaled = d / kQ4ScaleFactor;
  return q4_code_of_half(scaled, f32_to_f16(scaled));
}

void q4_trial_errors_scalar(const float* x, const float* d, const float* inv_d, const float* z,
                            int n, float* err) {
  for (int t = 0; t < n; ++t) {
    float e[8] = {};
    for (int i = 0; i < kBlock; i += 8) {
      for (int j = 0; j < 8; ++j) {
        // clamp(v, 0, 15) as (|v| - |v - 15| + 15) / 2: no branches, and the same operations
        // as the vector forms.
        const float v = x[i + j] * inv_d[t] + z[t];
        const float q = round_even(0.5f * (std::fabs(v) - std::fabs(v - 15.0f) + 15.0f));
        const float r = d[t] * (q - z[t]);
        e[j] += (x[i + j] - r) * (x[i + j] - r);
      }
    }
    err[t] = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
  }
}

void q4_trial_errors(const float* x, const float* d, const float* inv_d, const float* z, int n,
                     float* err) {
#if defined(KLEIN_X86)
  if (cpu_features().avx512) return q4_trial_errors_avx512(x, d, inv_d, z, n, err);
  if (cpu_features().avx2) return q4_trial_errors_avx2(x, d, inv_d, z, n, err);
#endif
  q4_trial_errors_scalar(x, d, inv_d, z, n, err);
}

void quantize_q8(const float* x, BlockQ8* out, int64_t n) {
#if defined(KLEIN_X86)
  if (cpu_features().avx512) return quantize_q8_avx512(x, out, n);
#endif
  quantize_q8_scalar(x, out, n);
}

void quantize_q8_scalar(const float* x, BlockQ8* out, int64_t n) {
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    float amax = 0;
    for (int i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
    // Quantize with the scale as stored, so the rounding of d to f16 costs nothing; round it
    // up if it came out below max|w| / 127 (small f16 values are coarse), or the largest
    // weight would be clipped.
    uint16_t scale = f32_to_f16(amax / 127.0f);
    if (f16_to_f32(scale) * 127.0f < amax && scale < 0x7bff) ++scale;
    out[b].scale = scale;
    const float d = f16_to_f32(scale);
    const float inv_d = d > 0 ? 1.0f / d : 0.0f;
    for (int i = 0; i < kBlock; ++i)
      out[b].q[i] = int8_t(round_clamped(x[i] * inv_d, -127, 127));
  }
}

void dequantize_q8(const BlockQ8* in, float* out, int64_t n) {
  for (int64_t b = 0; b < n / kBlock; ++b, out += kBlock) {
    const float d = f16_to_f32(in[b].scale);
    for (int i = 0; i < kBlock; ++i) out[i] = d * float(in[b].q[i]);
  }
}

void quantize_q4(const float* x, BlockQ4* out, int64_t n) {
#if defined(KLEIN_X86)
  if (cpu_features().avx512) return quantize_q4_avx512(x, out, n);
  if (cpu_features().avx2) return quantize_q4_avx2(x, out, n);
#endif
  quantize_q4_scalar(x, out, n);
}

void quantize_q4_scalar(const float* x, BlockQ4* out, int64_t n) {
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const Q4Choice c = choose_q4(x);
    out[b].scale = c.scale;
    out[b].zero = c.zero;
    const float d = q4_scale(c.scale);
    if (!(d > 0)) {
      std::memset(out[b].q, 0, sizeof out[b].q);
      continue;
    }
    q4_levels(x, 1.0f / d, c.zero / 16.0f, out[b].q);
  }
}

void q4_levels_scalar(const float* x, float inv_d, float z, uint8_t* q) {
  for (int i = 0; i < kBlock / 2; ++i)
    q[i] = uint8_t(q4_level(x[i], inv_d, z) | (q4_level(x[i + 16], inv_d, z) << 4));
}

void q4_levels(const float* x, float inv_d, float z, uint8_t* q) {
#if defined(KLEIN_X86)
  if (cpu_features().avx512) return q4_levels_avx512(x, inv_d, z, q);
#endif
  q4_levels_scalar(x, inv_d, z, q);
}

void dequantize_q4(const BlockQ4* in, float* out, int64_t n) {
  for (int64_t b = 0; b < n / kBlock; ++b, out += kBlock) {
    const float d = q4_scale(in[b].scale), z = in[b].zero / 16.0f;
    for (int i = 0; i < kBlock / 2; ++i) {
      out[i] = d * (float(in[b].q[i] & 15) - z);
      out[i + 16] = d * (float(in[b].q[i] >> 4) - z);
    }
  }
}

void make_tile_q8(const BlockQ8* const rows[kTileRows], TileQ8* out) {
  for (int r = 0; r < kTileRows; ++r) {
    const BlockQ8* b = rows[r];
    out->scale[r] = b ? b->scale : 0;
    for (int g = 0; g < kBlock / 4; ++g)
      for (int i = 0; i < 4; ++i) out->q[g][r][i] = uint8_t((b ? b->q[4 * g + i] : 0) + 128);
  }
}

void make_tile_q4(const BlockQ4* const rows[kTileRows], TileQ4* out) {
  for (int r = 0; r < kTileRows; ++r) {
    const BlockQ4* b = rows[r];
    out->scale[r] = b ? b->scale : 0;
    out->zero[r] = b ? b->zero : 0;
    // Byte j of a BlockQ4 holds columns j and j + 16, exactly what tile byte (g, i) with
    // j = 4g + i needs.
    for (int g = 0; g < kBlock / 8; ++g)
      for (int i = 0; i < 4; ++i) out->q[g][r][i] = b ? b->q[4 * g + i] : 0;
  }
}

BlockQ8 tile_row_q8(const TileQ8& tile, int r) {
  BlockQ8 b;
  b.scale = tile.scale[r];
  for (int g = 0; g < kBlock / 4; ++g)
    for (int i = 0; i < 4; ++i) b.q[4 * g + i] = int8_t(int(tile.q[g][r][i]) - 128);
  return b;
}

BlockQ4 tile_row_q4(const TileQ4& tile, int r) {
  BlockQ4 b;
  b.scale = tile.scale[r];
  b.zero = tile.zero[r];
  for (int g = 0; g < kBlock / 8; ++g)
    for (int i = 0; i < 4; ++i) b.q[4 * g + i] = tile.q[g][r][i];
  return b;
}

double dot_q8(const BlockQ8* w, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const double d = f16_to_f32(w[b].scale);
    for (int i = 0; i < kBlock; ++i) sum += d * w[b].q[i] * double(x[i]);
  }
  return sum;
}

double dot_q4(const BlockQ4* w, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const double d = q4_scale(w[b].scale), z = w[b].zero / 16.0;
    for (int i = 0; i < kBlock / 2; ++i) {
      sum += d * ((w[b].q[i] & 15) - z) * double(x[i]);
      sum += d * ((w[b].q[i] >> 4) - z) * double(x[i + 16]);
    }
  }
  return sum;
}

double dot_f32(const float* w, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(w[i]) * double(x[i]);
  return sum;
}

double dot_bf16(const uint16_t* w, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(bf16_to_f32(w[i])) * double(x[i]);
  return sum;
}

double dot_f16(const uint16_t* w, const float* x, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(f16_to_f32(w[i])) * double(x[i]);
  return sum;
}

}  // namespace klein::quant
