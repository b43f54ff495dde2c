#include "convert/storage.h"

#include "core/error.h"
#include "quant/blocks.h"
#include "quant/matmul.h"
#include "quant/types.h"

namespace klein::convert {

namespace {

bool storable(DType t) { return quant::is_storage_type(t); }

quant::Matrix matrix(const void* data, size_t nbytes, const StorageFormat& f, int64_t rows,
                     int64_t cols) {
  quant::Matrix m;
  m.type = f.type;
  m.layout = quant::Layout(f.layout);
  m.rows = rows;
  m.cols = cols;
  m.data = data;
  m.nbytes = nbytes;
  return m;
}

}  // namespace

StorageFormat storage_format(DType type) {
  check(storable(type), "storage type ", dtype_name(type), " cannot be stored in a container");
  StorageFormat f;
  f.type = type;
  const quant::Layout layout = quant::preferred_layout(type);
  f.layout = uint8_t(layout);
  f.block_size = dtype_is_float(type) ? 1 : uint32_t(quant::kBlock);
  f.row_granularity = quant::row_granularity(layout);
  return f;
}

bool can_store(DType type, const Shape& shape, std::string* why) {
  if (dtype_is_float(type)) return true;
  const int64_t cols = shape.size() < 2 ? 1 : numel(shape) / shape[0];
  if (shape.size() < 2) {
    if (why)
      *why = "a quantized type holds matrices only, not a tensor of shape " + shape_str(shape);
    return false;
  }
  if (cols % quant::kBlock != 0) {
    if (why)
      *why = "its rows of " + std::to_string(cols) + " values are not whole blocks of " +
             std::to_string(quant::kBlock);
    return false;
  }
  return true;
}

uint64_t storage_size(const StorageFormat& f, int64_t rows, int64_t cols) {
  return quant::storage_bytes(f.type, quant::Layout(f.layout), rows, cols);
}

void pack_rows(const float* w, int64_t rows, int64_t cols, const StorageFormat& f, void* out) {
  quant::pack(w, rows, cols, f.type, quant::Layout(f.layout), out);
}

void unpack_rows(const void* data, size_t nbytes, const StorageFormat& f, int64_t rows,
                 int64_t cols, int64_t r0, int64_t r1, float* out) {
  quant::unpack_rows(matrix(data, nbytes, f, rows, cols), r0, r1, out);
}

}  // namespace klein::convert
