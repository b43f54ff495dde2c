#include "ops/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace klein::ops {

RopeTable::RopeTable(std::span<const int64_t> positions, std::span<const int64_t> axes,
                     double theta, RopeAngle angle_rounding) {
  const int64_t naxes = int64_t(axes.size());
  check(naxes > 0, "RoPE: no axes");
  int64_t head_dim = 0;
  for (int64_t a : axes) {
    check(a > 0 && a % 2 == 0,
          "transformer config: RoPE axis widths must be positive and even, "
          "got ",
          a);
    head_dim += a;
  }
  check(int64_t(positions.size()) % naxes == 0, "internal: RoPE positions not a multiple of ",
        naxes);
  const int64_t tokens = int64_t(positions.size()) / naxes;
  cos_ = Tensor({tokens, head_dim});
  sin_ = Tensor({tokens, head_dim});

  // Per head-dim index: its axis and its frequency θ^(−2j/axis_width), in float64.
  std::vector<int64_t> axis_of(static_cast<size_t>(head_dim));
  std::vector<double> frequency(static_cast<size_t>(head_dim));
  for (int64_t a = 0, d = 0; a < naxes; ++a)
    for (int64_t i = 0; i < axes[size_t(a)]; ++i, ++d) {
      axis_of[size_t(d)] = a;
      frequency[size_t(d)] = 1.0 / std::pow(theta, double(2 * (i / 2)) / double(axes[size_t(a)]));
    }

  for (int64_t t = 0; t < tokens; ++t) {
    float* c = cos_.row(t);
    float* s = sin_.row(t);
    for (int64_t d = 0; d < head_dim; ++d) {
      const int64_t pos = positions[size_t(t * naxes + axis_of[size_t(d)])];
      if (angle_rounding == RopeAngle::Float64) {
        // FLUX.2 turns the ids into float32 before the float64 product.
        const double angle = double(float(pos)) * frequency[size_t(d)];
        c[d] = float(std::cos(angle));
        s[d] = float(std::sin(angle));
      } else {
        const float angle = float(double(pos) * frequency[size_t(d)]);
        c[d] = std::cos(angle);
        s[d] = std::sin(angle);
      }
    }
  }
}

void RopeTable::apply(float* x, int64_t ld, int64_t first_row, int64_t rows, int64_t heads,
                      Compute& cx) const {
  const int64_t D = head_dim();
  check(first_row >= 0 && first_row + rows <= tokens(), "internal: RoPE rows [", first_row, ", ",
        first_row + rows, ") outside a table of ", tokens(), " tokens");
  cx.pool().parallel_for(
      rows,
      [&](int64_t r0, int64_t r1, int) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* c = cos_.row(first_row + r);
          const float* s = sin_.row(first_row + r);
          for (int64_t h = 0; h < heads; ++h) {
            float* v = x + r * ld + h * D;
            for (int64_t d = 0; d < D; d += 2) {
              const float even = v[d], odd = v[d + 1];
              v[d] = even * c[d] - odd * s[d];
              v[d + 1] = odd * c[d + 1] + even * s[d + 1];
            }
          }
        }
      },
      16);
}

}  // namespace klein::ops
