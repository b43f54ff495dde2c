#pragma once
// Pieces that every integer kernel file shares. They have internal linkage on purpose: each
// kernel file compiles its own copy with its own instruction set, so the linker can never pick
// a copy built for AVX-512 (say) to run on a CPU without it.
#include <array>
#include <cstdint>
#include <utility>

#include "quant/kernels.h"

namespace klein::quant::detail {
namespace {

// Stores activation block e's scale d and the two sums derived from the sum of its int8
// values (see ActBlocks).
inline void store_block_sums(const ActBlocks& act, int64_t e, float d, int32_t sum) {
  act.scale[e] = d;
  act.scaled_sum[e] = d * float(sum);
  act.neg128_sum[e] = -128 * sum;
}

// The activations of rows m0..m0+R-1 at block b0 onwards, for an ActBlocks laid out with
// tile_rows = kRows: one stream, kRows entries per block, so that every address a kernel
// reads is a base plus a constant.
template <int kRows>
struct ActStreamOf {
  const int8_t* q;
  const float* scale;
  const float* scaled_sum;
  const int32_t* neg128_sum;

  ActStreamOf(const ActBlocks& act, int64_t m0, int64_t b0) {
    const int64_t e = act.entry(m0, b0);
    q = act.q + e * kBlock;
    scale = act.scale + e;
    scaled_sum = act.scaled_sum + e;
    neg128_sum = act.neg128_sum + e;
  }
  void next_block() {
    q += kRows * kBlock;
    scale += kRows;
    scaled_sum += kRows;
    neg128_sum += kRows;
  }
};

// The TilesQ8Fn / TilesQ4Fn entry points of a kernel file whose tile code is written for a
// fixed number of activation rows R: Rows<R>::run, overloaded for TileQ8 and TileQ4, for
// R = 1..kRows. `rows` picks the instance from a table.
template <int kRows, template <int> class Rows>
struct RowKernels {
  using Stream = ActStreamOf<kRows>;
  template <class Tile>
  using Fn = void (*)(const Stream&, const Tile*, int64_t, float*, int64_t, int, bool);

  template <class Tile, int... R>
  static constexpr std::array<Fn<Tile>, kRows> table(std::integer_sequence<int, R...>) {
    return {static_cast<Fn<Tile>>(&Rows<R + 1>::run)...};
  }

  template <class Tile>
  static void tiles(const ActBlocks& act, int64_t m0, int64_t b0, int rows, const Tile* tiles,
                    int64_t nblocks, float* y, int64_t ldy, int cols, bool accumulate) {
    static constexpr std::array<Fn<Tile>, kRows> fns =
        table<Tile>(std::make_integer_sequence<int, kRows>());
    fns[size_t(rows - 1)](Stream(act, m0, b0), tiles, nblocks, y, ldy, cols, accumulate);
  }
};

}  // namespace
}  // namespace klein::quant::detail
