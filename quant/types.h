#pragma once
// The storage types weights can have, one row each: everything that differs between them is
// here, and the rest of the engine asks this table instead of testing for a type.
//
//   F32, F16, BF16   plain floats, one value per "block", row-major only
//   Q8               blocks of 32 int8 values with an f16 scale (8.5 bits per weight)
//   Q4               blocks of 32 4-bit values with a scale code and zero point (4.5 bits)
//
// Adding a storage type: its block struct and reference quantize / dequantize / tile
// functions in quant/blocks.{h,cpp} (with static_assert on the sizes), a row in the table in
// quant/types.cpp, an integer kernel per instruction set in quant/kernels_*.cpp reached
// through `tiles` below, its storage code in the container format (formats/container), and
// tests in tests/quant against the scalar reference.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "core/dtype.h"

namespace klein::quant {

namespace detail {
struct ActBlocks;
struct AmxKernels;
struct Kernels;
}  // namespace detail

struct StorageType {
  DType type;
  std::string_view name;  // as written in policies, reports and options: "q8"
  bool quantized;         // integer blocks with a scale; false: a plain float type
  int precision_rank;     // orders types from least to most precise (Q4 0 ... F32 3)
  int64_t block_values;   // values per block along a row (1 for the float types)
  size_t block_bytes;     // bytes per block (the value size for the float types)
  size_t tile_bytes;      // one Interleaved16 tile (16 rows x 32 columns); 0: no such layout

  // n values (a multiple of block_values) of a row into blocks, and back.
  void (*quantize)(const float* x, void* blocks, int64_t n);
  void (*dequantize)(const void* blocks, float* out, int64_t n);
  // Quantized types: the blocks of 16 rows (null rows are zero) into one tile, and row r of
  // a tile back into a block.
  void (*make_tile)(const void* const* row_blocks, void* tile);
  void (*tile_row)(const void* tile, int r, void* block);
  // Quantized types: the instruction set's integer kernel (quant/kernels.h, tiles_q8 or
  // tiles_q4) on `nblocks` tiles of one 16-row group.
  void (*tiles)(const detail::Kernels& k, const detail::ActBlocks& act, int64_t m0, int64_t b0,
                int rows, const void* tiles, int64_t nblocks, float* y, int64_t ldy, int cols,
                bool accumulate);
  // Quantized types on AMX: `count` tiles as bf16 B tiles (quant/kernels.h AmxKernels).
  void (*tiles_to_bf16)(const detail::AmxKernels& amx, const void* tiles, int64_t count,
                        uint16_t* out);
};

// Every storage type, least precise first.
std::span<const StorageType> storage_types();
// The row of `type`; throws klein::Error naming the type when it is not a storage type.
const StorageType& storage_type(DType type);
// nullptr when `type` is not a storage type (I64, U8, ...).
const StorageType* find_storage_type(DType type);
// By name ("q4", case-insensitive); nullptr when unknown.
const StorageType* find_storage_type(std::string_view name);

inline bool is_storage_type(DType t) { return find_storage_type(t) != nullptr; }
inline bool is_quantized(DType t) {
  const StorageType* s = find_storage_type(t);
  return s && s->quantized;
}

}  // namespace klein::quant
