// The Z-Image networks' weight access (linear.h).
#include "models/zimage/linear.h"

#include "core/error.h"
#include "ops/linear.h"
#include "ops/low_rank.h"

namespace klein::zimage {

const Weight& matrix(const WeightUnit& unit, std::string_view name, int64_t out, int64_t in) {
  const Weight& w = unit.get(name);
  if (w.shape.size() != 2 || w.shape[0] != out || w.shape[1] != in)
    fail("tensor ", w.name, ": expected shape ", shape_str({out, in}), ", got ",
         shape_str(w.shape));
  return w;
}

// A small float tensor (norm weight, bias, pad token) of n values, as float32.
std::vector<float> vector_of(const WeightUnit& unit, std::string_view name, int64_t n) {
  const Weight& w = unit.get(name);
  if (w.numel() != n || (w.shape.size() != 1 && !(w.shape.size() == 2 && w.shape[0] == 1)))
    fail("tensor ", w.name, ": expected ", n, " values, got shape ", shape_str(w.shape));
  if (!dtype_is_float(w.dtype) || w.layout != 0)
    fail("tensor ", w.name, ": expected a plain float type, got ", dtype_name(w.dtype));
  return weight_to_floats(w);
}

// y = x·Wᵀ for M rows (x and y contiguous), plus s · (x·Aᵀ)·Bᵀ for every LoRA update of W
// (weights/lora.h; `adapters` may be null).
void linear(const float* x, int64_t M, const Weight& w, float* y, const Adapters* adapters,
            Compute& cx) {
  ops::linear(x, M, w, y, cx);
  if (!adapters) return;
  for (const LoraUpdate& u : adapters->on(w.name))
    ops::add_low_rank(x, M, w.cols(), u.down.data(), u.up.data(), w.rows(), w.cols(),
                      u.down.dim(0), u.scale, y, w.rows(), cx);
}

// y = x·Wᵀ + b for M rows.
void linear_bias(const float* x, int64_t M, const WeightUnit& unit, const std::string& name,
                 int64_t out, int64_t in, float* y, const Adapters* adapters, Compute& cx) {
  linear(x, M, matrix(unit, name + ".weight", out, in), y, adapters, cx);
  const std::vector<float> b = vector_of(unit, name + ".bias", out);
  ops::add_bias(y, M, out, out, b.data());
}

}  // namespace klein::zimage
