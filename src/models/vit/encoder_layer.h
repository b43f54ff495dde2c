#pragma once
// One pre-LN ViT encoder layer (ViTLayer).
#include "core/tensor.h"
#include "ops/compute.h"
#include "weights/safety_model.h"
#include "weights/weight_store.h"

namespace klein::vit {

// The activations a layer works in, allocated once for all layers of a call.
struct LayerBuffers {
  Tensor h;        // [T, D]  normed input / projection output
  Tensor q, k, v;  // [T, D]  heads side by side (head h at columns [h*hd, (h+1)*hd))
  Tensor attn;     // [T, D]
  Tensor mid;      // [T, F]  MLP hidden
  explicit LayerBuffers(const VitConfig& c);
};

// x [T, D] in place through the layer in `unit` (safety.layer.{i}).
void encoder_layer(const WeightUnit& unit, const VitConfig& c, Tensor& x, LayerBuffers& b,
                   Compute& cx);

}  // namespace klein::vit
