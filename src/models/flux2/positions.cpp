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

namespace {

std::vector<int64_t> flat(std::span<const PositionId> ids) {
  std::vector<int64_t> out;
  out.reserve(ids.size() * 4);
  for (const PositionId& id : ids) out.insert(out.end(), id.begin(), id.end());
  return out;
}

}  // namespace

RopeTable::RopeTable(std::span<const PositionId> ids, const std::array<int64_t, 4>& axes,
                     double theta)
    : ops::RopeTable(flat(ids), axes, theta, ops::RopeAngle::Float64) {}

}  // namespace klein::flux2
