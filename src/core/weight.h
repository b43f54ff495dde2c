#pragma once
// One weight tensor as the stores hand it out (weights/weight_store.h) and the kernels read it
// (ops/linear.h): a view of bytes with its name, type, shape and packing; the store owns the
// bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein {

// One weight tensor. Shapes are PyTorch's: Linear [out, in], Conv2d [out, in, kh, kw].
struct Weight {
  std::string name;       // canonical name
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  uint8_t layout = 0;     // quant::Layout of the bytes (0 = plain row-major)
  // An fp8 weight handed out as stored (SourceStore::set_decode_fp8(false), for convert):
  // value = decode(code) x scale[0] (scale_count 1) or x scale[row] (one per row); no scale:
  // 1. Owned by the unit.
  const float* scale = nullptr;
  int64_t scale_count = 0;
  // For messages about values read later (an fp8 weight handed out as stored): the canonical
  // name with the source tensor and file it comes from. Empty: `name` says enough.
  std::string origin;

  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const { return shape.empty() ? 1 : klein::numel(shape) / shape[0]; }
  int64_t numel() const { return klein::numel(shape); }
};

}  // namespace klein
