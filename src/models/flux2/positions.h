#pragma once
// The joint token sequence of one FLUX.2 generation and its rotary position embedding.
//
// Sequence order everywhere (activations, position ids, RoPE rows):
//   [ text (T rows) | target image (h·w) | reference 0 | reference 1 | ... ]
// Position ids are 4-axis (t, h, w, l):
//   text token l                      (0, 0, 0, l)
//   target token at latent (r, c)     (0, r, c, 0)        row-major, index r·w + c
//   reference i token at (r, c)       (10 + 10·i, r, c, 0) in that reference's own grid
// RoPE: head-dim index d belongs to axis a (dims [32a, 32a+32) for klein), pair j of that
// axis rotates by pos[a] · θ^(−2j/axis_dim); the two dims of a pair (2m, 2m+1) share one
// angle (interleaved pairs). Angles in float64, cos/sin rounded to float32, as the official
// model computes them.
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/grid.h"
#include "core/tensor.h"
#include "ops/compute.h"
#include "ops/rope.h"

namespace klein::flux2 {

// A latent grid of packed tokens: rows = H/16, cols = W/16 for an image of H×W pixels.
using LatentGrid = klein::LatentGrid;

// The token list of one generation: text, the target image and any number of references.
struct TokenLayout {
  int64_t text_tokens = 512;
  LatentGrid target;
  std::vector<LatentGrid> references;

  int64_t target_tokens() const { return target.tokens(); }
  int64_t reference_tokens() const;
  int64_t image_tokens() const { return target_tokens() + reference_tokens(); }
  int64_t total_tokens() const { return text_tokens + image_tokens(); }
  // First row of the image part (target, then references) in the joint sequence.
  int64_t image_row0() const { return text_tokens; }
};

using PositionId = std::array<int64_t, 4>;  // (t, h, w, l)

// The time offset of reference i (0-based) on axis t.
inline int64_t reference_time_offset(int64_t i) { return 10 + 10 * i; }

std::vector<PositionId> text_position_ids(int64_t tokens);
// Target tokens then every reference, in layout order.
std::vector<PositionId> image_position_ids(const TokenLayout& layout);
// Text then image: one id per row of the joint sequence.
std::vector<PositionId> joint_position_ids(const TokenLayout& layout);

// cos/sin of every (token, head-dim index) of the joint sequence (ops/rope.h, angles in
// float64): built once per generation (it depends only on the ids), applied to Q and K of
// every block at every step.
class RopeTable : public ops::RopeTable {
 public:
  RopeTable() = default;
  // axes: the head-dim width of each of the 4 axes (even, summing to the head dim).
  RopeTable(std::span<const PositionId> ids, const std::array<int64_t, 4>& axes, double theta);
};

}  // namespace klein::flux2
