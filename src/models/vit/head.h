#pragma once
// The classification head of ViTForImageClassification: the encoder's final LayerNorm, the
// classifier on the CLS token (token 0 only) and the softmax over the labels.
#include "core/tensor.h"
#include "models/vit/vit.h"
#include "ops/compute.h"
#include "weights/safety_model.h"
#include "weights/weight_store.h"

namespace klein::vit {

// x [T, D] -> normed [T, D] (vit.layernorm of every token, as transformers computes it) and
// the logits and probabilities of token 0. `unit` is safety.head.
Classification head(const WeightUnit& unit, const VitConfig& c, const Tensor& x, Tensor& normed,
                    Compute& cx);

// softmax over the logits (in double, rounded to float32).
std::vector<float> softmax(const std::vector<float>& logits);

}  // namespace klein::vit
