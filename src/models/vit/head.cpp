// ViTForImageClassification's head (modeling_vit.py):
//   normed = LN(x; vit.layernorm)            [T, D]
//   logits = normed[0] · Wᵀ + b              classifier [L, D], the CLS token only
//   probs  = softmax(logits)                 single_label_classification
#include "models/vit/head.h"

#include <algorithm>
#include <cmath>

#include "models/vit/weights.h"
#include "ops/linear.h"

namespace klein::vit {

std::vector<float> softmax(const std::vector<float>& logits) {
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> e(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += e[i] = std::exp(double(logits[i]) - top);
  std::vector<float> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = float(e[i] / total);
  return out;
}

Classification head(const WeightUnit& unit, const VitConfig& c, const Tensor& x, Tensor& normed,
                    Compute& cx) {
  const int64_t T = c.tokens(), D = c.hidden, L = int64_t(c.labels.size());
  layer_norm(unit, "vit.layernorm", x.data(), normed.data(), T, D, c.layer_norm_eps, cx);
  const Weight& w = shaped(unit, "classifier.weight", {L, D});
  const std::vector<float> b = floats(unit, "classifier.bias", {L});
  Classification out;
  out.logits.resize(size_t(L));
  ops::linear(normed.row(0), 1, w, out.logits.data(), cx);
  ops::add_bias(out.logits.data(), 1, L, L, b.data());
  out.probs = softmax(out.logits);
  return out;
}

}  // namespace klein::vit
