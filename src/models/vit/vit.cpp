// ViTForImageClassification top to bottom (shapes for ViT-B/16 at 224: P 16, G 14, T 197,
// D 768, H 12 x 64, F 3072, L 2):
//   x = embed(pixel_values)               [3, 224, 224] -> [197, 768]    embeddings.cpp
//   for each of the N layers:
//     x = encoder_layer(x)                [197, 768]                     encoder_layer.cpp
//   normed = LN(x); logits = classifier(normed[0]); probs = softmax      head.cpp
// Each unit is acquired when its piece runs and released after; the next layer's is read
// ahead while one runs.
#include "models/vit/vit.h"

#include "core/error.h"
#include "models/vit/embeddings.h"
#include "models/vit/encoder_layer.h"
#include "models/vit/head.h"

namespace klein::vit {

Classification classify(WeightStore& store, const VitConfig& c, const Tensor& pixel_values,
                        Compute& cx, const Observer& observe) {
  check(!c.labels.empty(), "safety classifier: the configuration has no labels");
  Tensor x({c.tokens(), c.hidden});  // [T, D] the token stream
  {
    store.prefetch(safety_layer_unit(0));
    UnitRef unit = store.acquire(kSafetyEmbeddingsUnit);
    embed(*unit, c, pixel_values, x, cx);
  }
  if (observe) observe("embeddings", x);

  LayerBuffers buffers(c);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    cx.stop_if_cancelled();
    UnitRef unit = store.acquire(safety_layer_unit(i));
    store.prefetch(i + 1 < c.num_layers ? safety_layer_unit(i + 1) : kSafetyHeadUnit);
    encoder_layer(*unit, c, x, buffers, cx);
    if (observe) observe("layer." + std::to_string(i + 1), x);
  }

  UnitRef unit = store.acquire(kSafetyHeadUnit);
  Tensor& normed = buffers.h;
  Classification out = head(*unit, c, x, normed, cx);
  if (observe) observe("final_layernorm", normed);
  return out;
}

}  // namespace klein::vit
