#pragma once
// The ViT image classifier of FLUX.2's safety check (transformers' ViTForImageClassification;
// Falconsai/nsfw_image_detection is ViT-B/16: 224x224 RGB, 16x16 patches, hidden 768, 12
// pre-LN layers of 12 heads, MLP 3072, labels normal / nsfw), from pixel values to the
// softmax over its labels. The math is in this folder, one file per piece:
//   preprocess    ViTImageProcessor: PIL bilinear resize, rescale, normalise -> [3, H, W]
//   embeddings    patches -> tokens [T = 1 + patches, D]: CLS first, + position embeddings
//   encoder_layer x += attention(LN(x)); x += MLP(LN(x))
//   head          final LayerNorm, classifier on the CLS token, softmax
//   safety        the verdict BFL draws from the scores: nsfw > threshold
// Weights come from a WeightStore in the units of weights/safety_model.h (the original
// safetensors, or any storage type the linear layers read).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/compute.h"
#include "weights/safety_model.h"
#include "weights/weight_store.h"

namespace klein::vit {

// The classifier's output for one image.
struct Classification {
  std::vector<float> logits;  // [labels], in id order (VitConfig::labels)
  std::vector<float> probs;   // softmax(logits)
};

// Sees the token stream [T, D] as it goes: "embeddings", "layer.{i}" after encoder layer i
// (1-based, as transformers' hidden_states[i]), "final_layernorm". For tests and dumps.
using Observer = std::function<void(const std::string& name, const Tensor& tokens)>;

// pixel_values [3, image_size, image_size] (preprocess.h) -> the scores. Weights are
// acquired one unit at a time and released after use.
Classification classify(WeightStore& store, const VitConfig& config, const Tensor& pixel_values,
                        Compute& cx, const Observer& observe = {});

}  // namespace klein::vit
