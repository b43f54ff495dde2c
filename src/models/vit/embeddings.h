#pragma once
// ViTEmbeddings: the image cut into patches, each projected to a token (the 16x16 stride-16
// convolution, as a product over the flattened patches), the CLS token put first and the
// position embeddings added.
#include "core/tensor.h"
#include "ops/compute.h"
#include "weights/safety_model.h"
#include "weights/weight_store.h"

namespace klein::vit {

// pixel_values [C, S, S] (S = image_size) -> x [T, D], T = 1 + (S / P)^2. `unit` is
// safety.embeddings.
void embed(const WeightUnit& unit, const VitConfig& c, const Tensor& pixel_values, Tensor& x,
           Compute& cx);

}  // namespace klein::vit
