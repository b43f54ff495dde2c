#include "convert/storage.h"

#include <cstring>

#include "core/error.h"

namespace klein::convert {

StorageFormat storage_format(DType type) {
  StorageFormat f;
  f.type = type;
  check(dtype_is_float(type), "storage type ", dtype_name(type), " is not available in this build");
  return f;
}

bool can_store(DType type, const Shape& shape, std::string* why) {
  if (dtype_is_float(type)) return true;
  if (why) *why = std::string(dtype_name(type)) + " is not available in this build";
  return false;
}

uint64_t storage_size(const StorageFormat& f, int64_t rows, int64_t cols) {
  return uint64_t(rows) * uint64_t(cols) * dtype_size(f.type);
}

void pack_rows(const float* w, int64_t rows, int64_t cols, const StorageFormat& f, void* out) {
  const size_t n = size_t(rows) * size_t(cols);
  switch (f.type) {
    case DType::F32: std::memcpy(out, w, n * sizeof(float)); return;
    case DType::BF16: f32_to_bf16(w, static_cast<uint16_t*>(out), n); return;
    case DType::F16: f32_to_f16(w, static_cast<uint16_t*>(out), n); return;
    default: break;
  }
  fail("storage type ", dtype_name(f.type), " is not available in this build");
}

void unpack_rows(const void* data, size_t nbytes, const StorageFormat& f, int64_t rows,
                 int64_t cols, int64_t r0, int64_t r1, float* out) {
  check(r0 >= 0 && r0 <= r1 && r1 <= rows, "internal: rows [", r0, ", ", r1, ") of ", rows);
  const size_t row_bytes = size_t(cols) * dtype_size(f.type);
  to_f32(f.type, static_cast<const std::byte*>(data) + size_t(r0) * row_bytes, out,
         size_t(r1 - r0) * size_t(cols));
}

}  // namespace klein::convert
