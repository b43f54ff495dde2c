#pragma once
// Reading a Qwen3 decoder layer's weights, shared by the text encoder and the language model:
// each checked against the shape the config implies, so that a wrong checkpoint fails with
// the tensor's name instead of reading out of bounds.
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "weights/weight_store.h"

namespace klein::qwen3 {

inline const Weight& projection(const WeightUnit& unit, const std::string& name, int64_t out,
                                int64_t in) {
  const Weight& w = unit.get(name);
  check(w.shape == Shape{out, in}, "tensor ", w.name, ": expected shape ", shape_str({out, in}),
        " for the text encoder config, got ", shape_str(w.shape));
  return w;
}

inline std::vector<float> norm_weight(const WeightUnit& unit, const std::string& name,
                                      int64_t dim) {
  const Weight& w = unit.get(name);
  check(w.shape == Shape{dim}, "tensor ", w.name, ": expected shape ", shape_str({dim}),
        ", got ", shape_str(w.shape));
  return weight_to_floats(w);
}

inline void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

}  // namespace klein::qwen3
