#pragma once
// Tensors: a Shape, a non-owning typed view, and an owning float32 activation buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace klein {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[512, 3072]"

// Memory aligned for the widest vector loads (and whole cache lines).
constexpr size_t kAlign = 64;

// x rounded up to a multiple of m (m > 0).
constexpr int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

struct FreeAligned {
  void operator()(void* p) const { std::free(p); }
};

template <class T>
std::unique_ptr<T[], FreeAligned> alloc_aligned(size_t n) {
  size_t bytes = (n * sizeof(T) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, bytes ? bytes : kAlign);
  if (!p) throw std::bad_alloc();
  return std::unique_ptr<T[], FreeAligned>(static_cast<T*>(p));
}

// A typed view of contiguous row-major data owned elsewhere (a mapped file, a buffer).
struct TensorView {
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const { return klein::numel(shape); }
};

// An owned, contiguous, 64-byte aligned float32 tensor: the activations.
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(Shape shape);
  static Tensor zeros(Shape shape);
  // A new tensor with this one's shape and values (an empty one stays empty).
  Tensor copy() const;

  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_[i]; }
  int64_t numel() const { return numel_; }
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  float* row(int64_t r) { return data_.get() + r * row_size(); }
  const float* row(int64_t r) const { return data_.get() + r * row_size(); }
  int64_t row_size() const { return shape_.empty() ? 1 : numel_ / shape_[0]; }
  // Same data, new shape of the same element count.
  void reshape(Shape shape);

 private:
  Shape shape_;
  int64_t numel_ = 0;
  std::unique_ptr<float[], FreeAligned> data_;
};

}  // namespace klein
