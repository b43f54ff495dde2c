// TDPBF16PS, as the AMX Q8/Q4 tiles use it (quant/kernels_amx.cpp): tiles 0-1 times tiles
// 2-3 into the four sum tiles 4-7, the kernel's register plan, operands loaded once.
#include <immintrin.h>

#include <cstdint>

#include "quant/amx_tiles.h"
#include "quant/peak.h"

namespace klein::quant::detail {

int64_t peak_loop_amx(int64_t rounds) {
  alignas(64) static const uint16_t operand[16 * 32] = {};  // bf16 zeros: 16 rows of 64 bytes
  alignas(64) float sums[16 * 16];
  _tile_loadconfig(&kAmxTileConfig);
  _tile_loadd(0, operand, 64);
  _tile_loadd(1, operand, 64);
  _tile_loadd(2, operand, 64);
  _tile_loadd(3, operand, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t r = 0; r < rounds; ++r) {
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    _tile_dpbf16ps(6, 1, 2);
    _tile_dpbf16ps(7, 1, 3);
  }
  _tile_stored(4, sums, 64);
  _tile_release();
  volatile float sink = sums[0];
  (void)sink;
  return rounds * 4 * 16 * 16 * 32;
}

}  // namespace klein::quant::detail
