#pragma once
// Rotary position embedding on interleaved pairs, for any number of position axes.
//
// Head-dim index d belongs to axis a (the axes' widths, each even, sum to the head dim); pair
// j of that axis rotates by pos[a] · θ^(−2j/axis_width), and the two dims of a pair (2m, 2m+1)
// share one angle. The table holds cos and sin per (token, head-dim index): built once per
// sequence (it depends only on the positions), applied to Q and K of every block.
//
// How the angle is rounded is the one difference between the models' official code, and at
// positions near 1000 it moves cos/sin by ~1e-4:
//   RopeAngle::Float64   angle = float32(pos) · f in float64, cos/sin in float64, rounded
//                        to float32 (FLUX.2);
//   RopeAngle::Float32   angle = pos · f in float64 rounded to float32, cos/sin of that
//                        float32 angle (Z-Image: torch.outer(...).float() then polar).
#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/compute.h"

namespace klein::ops {

enum class RopeAngle { Float64, Float32 };

class RopeTable {
 public:
  RopeTable() = default;
  // positions: [tokens, axes.size()] row-major; axes: the head-dim width of each axis.
  RopeTable(std::span<const int64_t> positions, std::span<const int64_t> axes, double theta,
            RopeAngle angle);

  int64_t tokens() const { return cos_.shape().empty() ? 0 : cos_.dim(0); }
  int64_t head_dim() const { return cos_.shape().empty() ? 0 : cos_.dim(1); }
  const Tensor& cos() const { return cos_; }  // [tokens, head_dim]
  const Tensor& sin() const { return sin_; }  // [tokens, head_dim]

  // Rotates every head of `rows` activation rows, in place: x is [rows, heads·head_dim]
  // (row stride ld), and x's row r uses table row first_row + r.
  //   y[2m]   = x[2m]·cos − x[2m+1]·sin
  //   y[2m+1] = x[2m+1]·cos + x[2m]·sin
  void apply(float* x, int64_t ld, int64_t first_row, int64_t rows, int64_t heads,
             Compute& cx) const;

 private:
  Tensor cos_;
  Tensor sin_;
};

}  // namespace klein::ops
