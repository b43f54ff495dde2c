#include "models/zimage/step_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "core/error.h"
#include "models/zimage/checkpoint/units.h"

namespace klein::zimage {

std::vector<Tensor> FirstBlockCache::forward(Transformer& model, const Tensor& latents,
                                             const Tensor& adaln,
                                             std::span<Activations* const> batch, Compute& cx) {
  const int64_t D = model.config().dim, B = int64_t(batch.size());
  check(B >= 1, "internal: a step cache call with no sequence");
  const int64_t layers = model.config().n_layers;
  const std::string nothing, second_layer = layers > 1 ? layer_unit(1) : std::string(),
                             first_unit = model.config().n_refiner_layers > 0
                                              ? noise_refiner_unit(0)
                                              : layer_unit(0);
  const bool first = kept_.empty();
  check(first || int64_t(kept_.size()) == B, "internal: the step cache's batch changed from ",
        kept_.size(), " to ", B, " sequences");
  if (first) kept_.resize(size_t(B));
  int64_t longest = 0;
  for (Activations* a : batch) longest = std::max(longest, a->layout.rows());

  // Layer 0 of every sequence, its residual, and the sums of the change.
  double moved = 0, before = 0;
  for (int64_t b = 0; b < B; ++b) {
    Activations& a = *batch[size_t(b)];
    Kept& k = kept_[size_t(b)];
    const int64_t S = a.layout.rows(), n = S * D, pad = longest - S;
    if (k.current.numel() != n) {
      k.previous = Tensor({S, D});
      k.current = Tensor({S, D});
      k.tail = Tensor({S, D});
    }
    model.start(latents, adaln, a, cx);
    std::memcpy(k.current.data(), a.seq.data(), size_t(n) * sizeof(float));
    k.pad_current.assign(size_t(D), 0.0f);
    // Read ahead: the next sequence's first unit; after the last, nothing until the decision.
    model.main_layer(0, adaln, a, cx, pad > 0 ? k.pad_current.data() : nullptr,
                     b + 1 < B ? &first_unit : &nothing);
    float* r = k.current.data();
    const float* out = a.seq.data();
    for (int64_t i = 0; i < n; ++i) r[i] = out[i] - r[i];
    if (first) continue;
    const float* prev = k.previous.data();
    for (int64_t i = 0; i < n; ++i) {
      moved += std::fabs(double(r[i]) - double(prev[i]));
      before += std::fabs(double(prev[i]));
    }
    if (pad > 0) {
      // The padding rows: a zero input, so their residual is layer 0's output itself.
      check(k.pad_previous.size() == size_t(D), "internal: the step cache's padding changed");
      double m = 0, p = 0;
      for (int64_t i = 0; i < D; ++i) {
        m += std::fabs(double(k.pad_current[size_t(i)]) - double(k.pad_previous[size_t(i)]));
        p += std::fabs(double(k.pad_previous[size_t(i)]));
      }
      moved += double(pad) * m;
      before += double(pad) * p;
    }
  }
  // The official test is change > threshold (a NaN change skips, as it does there).
  const double change = first ? std::numeric_limits<double>::quiet_NaN() : moved / before;
  const bool compute = first || change > threshold_;
  changes_.push_back(change);
  decisions_.push_back(compute);

  // The unit that comes next: the second layer to compute, the next step's first to skip.
  model.store().prefetch(compute && layers > 1 ? second_layer : first_unit);

  std::vector<Tensor> outputs;
  for (int64_t b = 0; b < B; ++b) {
    Activations& a = *batch[size_t(b)];
    Kept& k = kept_[size_t(b)];
    const int64_t n = a.layout.rows() * D;
    float* seq = a.seq.data();
    if (compute) {
      std::swap(k.previous, k.current);
      std::swap(k.pad_previous, k.pad_current);
      std::memcpy(k.current.data(), seq, size_t(n) * sizeof(float));  // layer 0's output
      // The last layer reads ahead the next sequence's second layer, or the next step's start.
      for (int64_t i = 1; i < layers; ++i)
        model.main_layer(i, adaln, a, cx, nullptr,
                         i + 1 == layers ? (b + 1 < B ? &second_layer : &first_unit) : nullptr);
      float* tail = k.tail.data();
      const float* head = k.current.data();
      for (int64_t i = 0; i < n; ++i) tail[i] = seq[i] - head[i];
    } else {
      const float* tail = k.tail.data();
      for (int64_t i = 0; i < n; ++i) seq[i] = tail[i] + seq[i];
    }
    outputs.push_back(model.finish(adaln, a, cx));
  }
  if (compute) ++computed_;
  return outputs;
}

size_t FirstBlockCache::plan_bytes(const TransformerConfig& config, const SequenceLayout& layout,
                                   int64_t sequences) {
  return size_t(sequences) * 3 * size_t(layout.rows()) * size_t(config.dim) * sizeof(float);
}

}  // namespace klein::zimage
