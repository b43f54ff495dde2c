#pragma once
// Step caching for the Z-Image transformer: diffusers' FirstBlockCache
// (hooks/first_block_cache.py), on the main layers as the official hook sees them (head: layer
// 0, tail: the last layer).
//
// At each call of the transformer (one step; the batch is the prompt's sequence and, under
// guidance, the negative prompt's), layer 0 always runs. Its residual r = output − input over
// the whole batch is compared with the one kept from the last call that ran every layer:
//   change = mean|r − r_prev| / mean|r_prev|      (means over every value of the batch)
// Above the threshold (and at the first call) the other layers run, r_prev becomes r, and the
// tail residual (the last layer's output − layer 0's output) is kept. At or below it the other
// layers are skipped: each sequence becomes layer 0's output + its kept tail residual. The
// state lives in one generation.
//
// The official batch pads a shorter sequence with zero rows to the longest one's length, and
// the means see those rows too: main_layer's padding row gives their layer-0 output (all of a
// sequence's padding rows are alike), counted as many times as the sequence has them.
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "models/zimage/transformer.h"

namespace klein::zimage {

class FirstBlockCache {
 public:
  explicit FirstBlockCache(double threshold) : threshold_(threshold) {}

  // One transformer call: the model output of each sequence of `batch` (embed_caption done on
  // each) for `latents` at the modulation `adaln`. The batch keeps its sequences from call to
  // call.
  std::vector<Tensor> forward(Transformer& model, const Tensor& latents, const Tensor& adaln,
                              std::span<Activations* const> batch, Compute& cx);

  double threshold() const { return threshold_; }
  int64_t computed() const { return computed_; }
  int64_t skipped() const { return int64_t(changes_.size()) - computed_; }
  // Per call: the change (NaN at the first call) and whether every layer ran.
  const std::vector<double>& changes() const { return changes_; }
  const std::vector<bool>& decisions() const { return decisions_; }

  // What the cache holds for a batch of `sequences` sequences of `layout`: three [rows, D]
  // tensors per sequence (r_prev, r or layer 0's output, the tail residual).
  static size_t plan_bytes(const TransformerConfig& config, const SequenceLayout& layout,
                           int64_t sequences);

 private:
  struct Kept {
    Tensor previous, current, tail;   // [S, D]: r_prev, r (then layer 0's output), the tail
    std::vector<float> pad_previous, pad_current;  // the padding row's residual, same roles
  };
  double threshold_;
  std::vector<Kept> kept_;
  int64_t computed_ = 0;
  std::vector<double> changes_;
  std::vector<bool> decisions_;
};

}  // namespace klein::zimage
