#include "quant/types.h"

#include <array>
#include <cctype>
#include <cstring>
#include <string>

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/kernels.h"

namespace klein::quant {
namespace {

// The float types: values converted one by one (row-major only).
template <DType T>
void to_floats(const void* in, float* out, int64_t n) {
  to_f32(T, in, out, size_t(n));
}

template <DType T>
void from_floats(const float* x, void* out, int64_t n) {
  if constexpr (T == DType::F32) std::memcpy(out, x, size_t(n) * sizeof(float));
  if constexpr (T == DType::BF16) f32_to_bf16(x, static_cast<uint16_t*>(out), size_t(n));
  if constexpr (T == DType::F16) f32_to_f16(x, static_cast<uint16_t*>(out), size_t(n));
}

// The quantized types: their block functions behind untyped pointers. The kernel entry
// points are members of an ISA's kernel table, named by member pointer.
template <class Block, class Tile, auto quantize_fn, auto dequantize_fn, auto make_tile_fn,
          auto tile_row_fn, auto tiles_fn, auto to_bf16_fn>
struct Blocks {
  static void quantize(const float* x, void* b, int64_t n) {
    quantize_fn(x, static_cast<Block*>(b), n);
  }
  static void dequantize(const void* b, float* out, int64_t n) {
    dequantize_fn(static_cast<const Block*>(b), out, n);
  }
  static void make_tile(const void* const* rows, void* tile) {
    make_tile_fn(reinterpret_cast<const Block* const*>(rows), static_cast<Tile*>(tile));
  }
  static void tile_row(const void* tile, int r, void* block) {
    *static_cast<Block*>(block) = tile_row_fn(*static_cast<const Tile*>(tile), r);
  }
  static void tiles(const detail::Kernels& k, const detail::ActBlocks& act, int64_t m0,
                    int64_t b0, int rows, const void* t, int64_t nblocks, float* y, int64_t ldy,
                    int cols, bool accumulate) {
    (k.*tiles_fn)(act, m0, b0, rows, static_cast<const Tile*>(t), nblocks, y, ldy, cols,
                  accumulate);
  }
  static void tiles_to_bf16(const detail::AmxKernels& amx, const void* t, int64_t count,
                            uint16_t* out) {
    (amx.*to_bf16_fn)(static_cast<const Tile*>(t), count, out);
  }
};

using Q8 = Blocks<BlockQ8, TileQ8, quantize_q8, dequantize_q8, make_tile_q8, tile_row_q8,
                  &detail::Kernels::tiles_q8, &detail::AmxKernels::q8_tiles_to_bf16>;
using Q4 = Blocks<BlockQ4, TileQ4, quantize_q4, dequantize_q4, make_tile_q4, tile_row_q4,
                  &detail::Kernels::tiles_q4, &detail::AmxKernels::q4_tiles_to_bf16>;

// unpack_rows keeps one block of any quantized type in 64 bytes.
static_assert(sizeof(BlockQ8) <= 64 && sizeof(BlockQ4) <= 64);

constexpr std::array<StorageType, 5> kTypes = {{
    {DType::Q4, "q4", true, 0, kBlock, sizeof(BlockQ4), sizeof(TileQ4), Q4::quantize,
     Q4::dequantize, Q4::make_tile, Q4::tile_row, Q4::tiles, Q4::tiles_to_bf16},
    {DType::Q8, "q8", true, 1, kBlock, sizeof(BlockQ8), sizeof(TileQ8), Q8::quantize,
     Q8::dequantize, Q8::make_tile, Q8::tile_row, Q8::tiles, Q8::tiles_to_bf16},
    {DType::F16, "f16", false, 2, 1, 2, 0, from_floats<DType::F16>, to_floats<DType::F16>, nullptr,
     nullptr, nullptr, nullptr},
    {DType::BF16, "bf16", false, 2, 1, 2, 0, from_floats<DType::BF16>, to_floats<DType::BF16>,
     nullptr, nullptr, nullptr, nullptr},
    {DType::F32, "f32", false, 3, 1, 4, 0, from_floats<DType::F32>, to_floats<DType::F32>, nullptr,
     nullptr, nullptr, nullptr},
}};

}  // namespace

std::span<const StorageType> storage_types() { return kTypes; }

const StorageType* find_storage_type(DType type) {
  for (const StorageType& s : kTypes)
    if (s.type == type) return &s;
  return nullptr;
}

const StorageType* find_storage_type(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  for (const StorageType& s : kTypes)
    if (s.name == lower) return &s;
  return nullptr;
}

const StorageType& storage_type(DType type) {
  const StorageType* s = find_storage_type(type);
  if (!s) fail(dtype_name(type), " is not a weight storage type (F32, BF16, F16, Q8, Q4)");
  return *s;
}

}  // namespace klein::quant
