#include "core/tensor.h"

#include <cstring>

#include "core/error.h"

namespace klein {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Tensor::Tensor(Shape shape) : shape_(std::move(shape)), numel_(klein::numel(shape_)) {
  data_ = alloc_aligned<float>(size_t(numel_));
}

Tensor Tensor::copy() const {
  if (numel_ == 0 && shape_.empty()) return Tensor();
  Tensor t(shape_);
  if (numel_ > 0) std::memcpy(t.data(), data(), size_t(numel_) * sizeof(float));
  return t;
}

Tensor Tensor::zeros(Shape shape) {
  Tensor t(std::move(shape));
  std::memset(t.data(), 0, size_t(t.numel()) * sizeof(float));
  return t;
}

void Tensor::reshape(Shape shape) {
  check(klein::numel(shape) == numel_, "internal: reshape ", shape_str(shape_), " to ",
        shape_str(shape), " changes the element count");
  shape_ = std::move(shape);
}

}  // namespace klein
