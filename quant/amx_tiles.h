#pragma once
// The AMX tile configuration every tile kernel here uses (quant/kernels_amx.cpp,
// ops/attention_amx.cpp, ops/conv2d_amx.cpp): palette 1, tiles 0-7 of 16 rows x 64 bytes.
// Only for files compiled with the AMX flags; load it with _tile_loadconfig(&kAmxTileConfig).
#include <cstdint>

namespace klein::quant {

struct alignas(64) AmxTileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// A constant in memory on purpose: GCC 12 does not see that ldtilecfg reads its operand and
// drops the stores into a configuration built in a local variable.
inline constexpr AmxTileConfig kAmxTileConfig = [] {
  AmxTileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.bytes_per_row[t] = 64;
  }
  return c;
}();

}  // namespace klein::quant
