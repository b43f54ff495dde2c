#pragma once
// NumPy .npy files (format 1.0/2.0/3.0, little-endian, C order): float32, int64, int32
// (and uint8, read only).
// Used for golden test vectors, --noise input and --dump output.
#include <filesystem>
#include <vector>

#include "core/tensor.h"

namespace klein {

struct NpyArray {
  DType dtype = DType::F32;  // F32, I64, I32 or U8
  Shape shape;
  std::vector<std::byte> bytes;

  int64_t numel() const { return klein::numel(shape); }
  // The values as float32 / int64, converting from the stored type.
  std::vector<float> to_f32() const;
  std::vector<int64_t> to_i64() const;
  Tensor to_tensor() const;  // float32 tensor of the same shape
};

NpyArray read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, DType dtype, const Shape& shape, const void* data);
inline void write_npy(const std::filesystem::path& path, const Tensor& t) {
  write_npy(path, DType::F32, t.shape(), t.data());
}

}  // namespace klein
