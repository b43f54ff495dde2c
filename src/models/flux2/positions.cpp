#include "models/flux2/positions.h"

#include <cmath>

#include "core/error.h"

namespace klein::flux2 {

int64_t TokenLayout::reference_tokens() const {
  int64_t n = 0;
  for (const LatentGrid& g : references) n += g.tokens();
  return n;
}

std::vector<PositionId> text_position_ids(int64_t tokens) {
  std::vector<PositionId> ids;
  ids.reserve(size_t(tokens));
  for (int64_t l = 0; l < tokens; ++l) ids.push_back({0, 0, 0, l});
  return ids;
}

namespace {

void append_grid_ids(std::vector<PositionId>& ids, int64_t time, const LatentGrid& g) {
  for (int64_t r = 0; r < g.rows; ++r)
    for (int64_t c = 0; c < g.cols; ++c) ids.push_back({time, r, c, 0});
}

}  // namespace

std::vector<PositionId> image_position_ids(const TokenLayout& layout) {
  std::vector<PositionId> ids;
  ids.reserve(size_t(layout.image_tokens()));
  append_grid_ids(ids, 0, layout.target);
  for (size_t i = 0; i < layout.references.size(); ++i)
    append_grid_ids(ids, reference_time_offset(int64_t(i)), layout.references[i]);
  return ids;
}

std::vector<PositionId> joint_position_ids(const TokenLayout& layout) {
  std::vector<PositionId> ids = text_position_ids(layout.text_tokens);
  const std::vector<PositionId> image = image_position_ids(layout);
  ids.insert(ids.end(), image.begin(), image.end());
  return ids;
}

RopeTable::RopeTable(std::span<const PositionId> ids, const std::array<int64_t, 4>& axes,
                     double theta) {
  int64_t head_dim = 0;
  for (int64_t a : axes) {
    check(a > 0 && a % 2 == 0, "transformer config: axes_dims_rope entries must be positive and "
          "even, got ", a);
    head_dim += a;
  }
  const int64_t tokens = int64_t(ids.size());
  cos_ = Tensor({tokens, head_dim});
  sin_ = Tensor({tokens, head_dim});

  // Per head-dim index: its axis and its frequency θ^(−2j/axis_dim), in float64.
  std::vector<int> axis_of(static_cast<size_t>(head_dim));
  std::vector<double> frequency(static_cast<size_t>(head_dim));
  for (int64_t a = 0, d = 0; a < 4; ++a)
    for (int64_t i = 0; i < axes[size_t(a)]; ++i, ++d) {
      const int64_t pair = i / 2;
      axis_of[size_t(d)] = int(a);
      frequency[size_t(d)] = 1.0 / std::pow(theta, double(2 * pair) / double(axes[size_t(a)]));
    }

  for (int64_t t = 0; t < tokens; ++t) {
    float* c = cos_.row(t);
    float* s = sin_.row(t);
    for (int64_t d = 0; d < head_dim; ++d) {
      // The official model turns the ids into float32 before the float64 product.
      const double pos = double(float(ids[size_t(t)][size_t(axis_of[size_t(d)])]));
      const double angle = pos * frequency[size_t(d)];
      c[d] = float(std::cos(angle));
      s[d] = float(std::sin(angle));
    }
  }
}

void RopeTable::apply(float* x, int64_t ld, int64_t first_row, int64_t rows, int64_t heads,
                      Compute& cx) const {
  const int64_t D = head_dim();
  check(first_row >= 0 && first_row + rows <= tokens(), "internal: RoPE rows [", first_row, ", ",
        first_row + rows, ") outside a table of ", tokens(), " tokens");
  cx.pool().parallel_for(rows, [&](int64_t r0, int64_t r1, int) {
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
  }, 16);
}

}  // namespace klein::flux2
