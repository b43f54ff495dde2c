#pragma once
// The Z-Image networks' weights as their forwards read them (the transformer, the ControlNet):
// checked shapes, small float vectors, and linear layers with LoRA updates beside them.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/compute.h"
#include "weights/lora.h"
#include "weights/weight_store.h"

namespace klein::zimage {

// The weight `name` of `unit`, which must be [out, in].
const Weight& matrix(const WeightUnit& unit, std::string_view name, int64_t out, int64_t in);
// A small float tensor (norm weight, bias, pad token) of n values, as float32.
std::vector<float> vector_of(const WeightUnit& unit, std::string_view name, int64_t n);
// y = x·Wᵀ for M rows (x and y contiguous), plus s · (x·Aᵀ)·Bᵀ for every LoRA update of W
// (weights/lora.h; `adapters` may be null).
void linear(const float* x, int64_t M, const Weight& w, float* y, const Adapters* adapters,
            Compute& cx);
// y = x·Wᵀ + b for M rows, W = name.weight [out, in], b = name.bias.
void linear_bias(const float* x, int64_t M, const WeightUnit& unit, const std::string& name,
                 int64_t out, int64_t in, float* y, const Adapters* adapters, Compute& cx);

}  // namespace klein::zimage
