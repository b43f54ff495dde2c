#pragma once
// GroupNorm over [C, H·W] float32 activations, split in two halves: the statistics become one
// affine map per channel, which whoever reads the values next applies on the fly (a
// convolution gathering its input, or apply_channel_affine). The normalised tensor then never
// has to exist in full, which matters for the VAE decoder at full resolution.
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/compute.h"

namespace klein::ops {

// y = (x - mean[c]) · scale[c] + shift[c], then x·sigmoid(x) if `silu`.
struct ChannelAffine {
  std::vector<float> mean;   // [C] mean of the channel's group
  std::vector<float> scale;  // [C] gamma[c] / sqrt(var(group) + eps)
  std::vector<float> shift;  // [C] beta[c]
  bool silu = false;

  int64_t channels() const { return int64_t(mean.size()); }
  // y[i] = f(x[i]) for n values of channel c (y may equal x).
  void apply(int64_t c, const float* x, float* y, int64_t n) const;
};

// Statistics of GroupNorm with `groups` groups of consecutive channels over x [C, pixels]:
// biased variance, computed in double so a group of millions of values loses nothing.
// gamma and beta are [C]. The result does not depend on the thread count.
ChannelAffine group_norm_affine(const float* x, int64_t channels, int64_t pixels, int64_t groups,
                                const float* gamma, const float* beta, float eps, bool silu,
                                Compute& cx);

// The same statistics over values that are not in one array (e.g. a tensor kept in a scratch
// file): read(g, offset, n, buffer) returns values [offset, offset + n) of group g (its
// channels' pixels, channel after channel), either pointing into memory or copied into
// `buffer` (room for n values). The result is identical to the array form's.
using GroupReader =
    std::function<const float*(int64_t group, int64_t offset, int64_t n, float* buffer)>;
ChannelAffine group_norm_affine(const GroupReader& read, int64_t channels, int64_t pixels,
                                int64_t groups, const float* gamma, const float* beta, float eps,
                                bool silu, Compute& cx);

// y[c, :] = a applied to x[c, :] for every channel; y may equal x.
void apply_channel_affine(const float* x, float* y, int64_t channels, int64_t pixels,
                          const ChannelAffine& a, Compute& cx);

}  // namespace klein::ops
