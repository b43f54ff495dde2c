#pragma once
// Reading the classifier's tensors inside a unit, each checked against the shape the
// configuration implies (a container or store that differs fails naming the tensor, never
// reads out of bounds), and the LayerNorm with affine parameters every piece uses.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "ops/compute.h"
#include "ops/norm.h"
#include "weights/weight_store.h"

namespace klein::vit {

inline const Weight& shaped(const WeightUnit& unit, const std::string& name, const Shape& shape) {
  const Weight& w = unit.get(name);
  check(w.shape == shape, "tensor ", w.name, ": expected shape ", shape_str(shape),
        " for the safety classifier's config, got ", shape_str(w.shape));
  return w;
}

// A small float tensor (bias, norm weight, embedding table) as float32 values.
inline std::vector<float> floats(const WeightUnit& unit, const std::string& name,
                                 const Shape& shape) {
  return weight_to_floats(shaped(unit, name, shape));
}

// y = LayerNorm(x) * weight + bias over rows of `dim`, with the weights `<name>.weight` and
// `<name>.bias` of the unit.
inline void layer_norm(const WeightUnit& unit, const std::string& name, const float* x, float* y,
                       int64_t rows, int64_t dim, double eps, Compute& cx) {
  const std::vector<float> w = floats(unit, name + ".weight", {dim});
  const std::vector<float> b = floats(unit, name + ".bias", {dim});
  ops::layer_norm(x, y, rows, dim, float(eps), cx);
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = y + r * dim;
      for (int64_t i = 0; i < dim; ++i) row[i] = row[i] * w[size_t(i)] + b[size_t(i)];
    }
  }, 16);
}

}  // namespace klein::vit
