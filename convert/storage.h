#pragma once
// How a float32 weight becomes the bytes a container stores for it: the one place the
// converter asks the numeric formats (quant/) for sizes, layouts and packing.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein::convert {

struct StorageFormat {
  DType type = DType::BF16;
  uint8_t layout = 0;           // quant::Layout
  uint32_t block_size = 1;      // elements per block (1 for plain types)
  int64_t row_granularity = 1;  // rows are packed in pieces that start at multiples of this
};

// The format the kernels want for `type` (quant::preferred_layout).
StorageFormat storage_format(DType type);

// Whether a tensor of this shape can be stored as `type`; if not, `why` says why (quantized
// types hold matrices whose rows are whole blocks).
bool can_store(DType type, const Shape& shape, std::string* why = nullptr);

// Bytes of rows x cols at this format (a tensor is stored as rows = shape[0], cols = the rest).
uint64_t storage_size(const StorageFormat& f, int64_t rows, int64_t cols);

// Converts / quantizes float32 rows w[rows, cols] into `out` (storage_size(f, rows, cols)
// bytes). A tensor may be packed in pieces: rows [r0, r1), r0 a multiple of
// f.row_granularity, go to out + storage_size(f, r0, cols).
void pack_rows(const float* w, int64_t rows, int64_t cols, const StorageFormat& f, void* out);

// Reads rows [r0, r1) of a stored tensor back as float32 (dequantizing).
void unpack_rows(const void* data, size_t nbytes, const StorageFormat& f, int64_t rows,
                 int64_t cols, int64_t r0, int64_t r1, float* out);

}  // namespace klein::convert
