#include "quant/blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace klein::quant {
namespace {

// v rounded to the nearest integer in [lo, hi]; clamping first keeps the conversion defined
// for any float.
inline int round_clamped(float v, int lo, int hi) {
  return int(round_even(std::clamp(v, float(lo), float(hi))));
}

// ---- Q4 search ------------------------------------------------------------------------------

struct Q4Choice {
  uint8_t scale = 0;
  uint8_t zero = 0;
};

inline int q4_level(float x, float inv_d, float z) { return round_clamped(x * inv_d + z, 0, 15); }

// Squared error of one block quantized with (scale code, zero code). All in float with eight
// partial sums, a shape the compiler vectorises: the search calls this 39 times per block.
float q4_block_error(const float* x, Q4Choice c) {
  const float d = q4_scale(c.scale);
  const float inv_d = d > 0 ? 1.0f / d : 0.0f, z = c.zero / 16.0f;
  float e[8] = {};
  for (int i = 0; i < kBlock; i += 8) {
    for (int j = 0; j < 8; ++j) {
      // clamp(v, 0, 15) as (|v| - |v - 15| + 15) / 2: no branches, so the loop vectorises.
      const float v = x[i + j] * inv_d + z;
      const float q = round_even(0.5f * (std::fabs(v) - std::fabs(v - 15.0f) + 15.0f));
      const float r = d * (q - z);
      e[j] += (x[i + j] - r) * (x[i + j] - r);
    }
  }
  return ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

// The zero code that puts `lo` on level 0 for scale d.
uint8_t q4_zero_for(float lo, float d) {
  return uint8_t(round_clamped(-lo / d * 16.0f, 0, 255));
}

// Picks (scale, zero) for one block by trying ranges [lo', hi'] slightly inside [min, max]
// (clipping the extremes often lowers the total error), then refining the best choice by
// one scale code and two zero steps either way. 40 trials; an exhaustive search over 729
// trials finds choices only 0.5% better in RMS error.
Q4Choice choose_q4(const float* x) {
  const float lo = *std::min_element(x, x + kBlock);
  const float hi = *std::max_element(x, x + kBlock);
  if (lo == 0 && hi == 0) return {};
  Q4Choice best;
  float best_err = INFINITY;
  auto consider = [&](Q4Choice c) {
    const float e = q4_block_error(x, c);
    if (e < best_err) {
      best_err = e;
      best = c;
    }
  };
  // A constant block has no range: span it from zero instead.
  const float span = hi > lo ? hi - lo : std::max(std::fabs(lo), std::fabs(hi));
  const float lo_base = hi > lo ? lo : std::min(lo, 0.0f);
  constexpr int kSteps = 5;
  constexpr float kShrink = 0.03f;
  for (int a = 0; a < kSteps; ++a) {
    for (int b = 0; b < kSteps; ++b) {
      const float l = lo_base + span * kShrink * float(a);
      const float width = span * (1.0f - kShrink * float(a + b));
      const uint8_t code = std::max<uint8_t>(1, q4_scale_code(width / 15.0f));
      consider({code, q4_zero_for(l, q4_scale(code))});
    }
  }
  const Q4Choice centre = best;
  const float centre_d = q4_scale(centre.scale);
  for (int dc = -1; dc <= 1; ++dc) {
    const int code = std::clamp(int(centre.scale) + dc, 1, int(kQ4MaxScaleCode));
    const float d = q4_scale(uint8_t(code));
    // Keep the zero point at the same place in value space when the scale changes.
    const int z0 = round_clamped(float(centre.zero) * centre_d / d, 0, 255);
    for (int dz = -2; dz <= 2; ++dz) {
      if (dc == 0 && dz == 0) continue;
      consider({uint8_t(code), uint8_t(std::clamp(z0 + dz, 0, 255))});
    }
  }
  return best;
}

}  // namespace

uint8_t q4_scale_code(float d) {
  if (!(d > 0)) return 0;
  // Codes are the f16 bit patterns of d * 256 with the low 7 bits dropped; rounding the bit
  // pattern at bit 7 rounds to the nearest code within a binade.
  const uint16_t h = f32_to_f16(d / kQ4ScaleFactor);
  if (h >= 0x7c00) return kQ4MaxScaleCode;
  return uint8_t(std::min((h + 64) >> 7, int(kQ4MaxScaleCode)));
}

void quantize_q8(const float* x, BlockQ8* out, int64_t n) {
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
  for (int64_t b = 0; b < n / kBlock; ++b, x += kBlock) {
    const Q4Choice c = choose_q4(x);
    out[b].scale = c.scale;
    out[b].zero = c.zero;
    const float d = q4_scale(c.scale);
    const float inv_d = d > 0 ? 1.0f / d : 0.0f, z = c.zero / 16.0f;
    for (int i = 0; i < kBlock / 2; ++i) {
      const int low = d > 0 ? q4_level(x[i], inv_d, z) : 0;
      const int high = d > 0 ? q4_level(x[i + 16], inv_d, z) : 0;
      out[b].q[i] = uint8_t(low | (high << 4));
    }
  }
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
