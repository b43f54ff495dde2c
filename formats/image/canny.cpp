#include "formats/image/canny.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/error.h"

namespace klein {

Image canny_edges(const Image& rgb, double low_threshold, double high_threshold) {
  check(std::isfinite(low_threshold) && std::isfinite(high_threshold),
        "Canny thresholds must be numbers, got ", low_threshold, " and ", high_threshold);
  if (low_threshold > high_threshold) std::swap(low_threshold, high_threshold);
  const int64_t low = int64_t(std::floor(low_threshold));
  const int64_t high = int64_t(std::floor(high_threshold));
  const int W = rgb.width, H = rgb.height;
  Image out(W, H);
  if (W == 0 || H == 0) return out;

  // Gradients: per pixel the channel of the largest L1 magnitude.
  std::vector<int32_t> mag(size_t(W) * H);
  std::vector<int16_t> gx(size_t(W) * H), gy(size_t(W) * H);
  auto at = [&](int x, int y, int c) {
    x = x < 0 ? 0 : x >= W ? W - 1 : x;  // replicated border
    y = y < 0 ? 0 : y >= H ? H - 1 : y;
    return int(rgb.pixel(x, y)[c]);
  };
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      int32_t best = -1;
      int best_dx = 0, best_dy = 0;
      for (int c = 0; c < 3; ++c) {
        const int dx = (at(x + 1, y - 1, c) - at(x - 1, y - 1, c)) +
                       2 * (at(x + 1, y, c) - at(x - 1, y, c)) +
                       (at(x + 1, y + 1, c) - at(x - 1, y + 1, c));
        const int dy = (at(x - 1, y + 1, c) - at(x - 1, y - 1, c)) +
                       2 * (at(x, y + 1, c) - at(x, y - 1, c)) +
                       (at(x + 1, y + 1, c) - at(x + 1, y - 1, c));
        const int32_t m = std::abs(dx) + std::abs(dy);
        if (m > best) {
          best = m;
          best_dx = dx;
          best_dy = dy;
        }
      }
      const size_t i = size_t(y) * W + x;
      mag[i] = best;
      gx[i] = int16_t(best_dx);
      gy[i] = int16_t(best_dy);
    }
  auto magnitude = [&](int x, int y) -> int32_t {
    if (x < 0 || x >= W || y < 0 || y >= H) return 0;
    return mag[size_t(y) * W + x];
  };

  // Thinning: 0 not an edge, 1 a candidate (stayed, above low), 2 an edge (above high).
  constexpr int kShift = 15;
  const int64_t tg22 = int64_t(0.4142135623730950488016887242097 * (1 << kShift) + 0.5);
  std::vector<uint8_t> state(size_t(W) * H, 0);
  std::vector<int64_t> stack;
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x) {
      const size_t i = size_t(y) * W + x;
      const int32_t m = mag[i];
      if (m <= low) continue;
      const int xs = gx[i], ys = gy[i];
      const int64_t ax = std::abs(xs), ay = int64_t(std::abs(ys)) << kShift;
      const int64_t tg22x = ax * tg22;
      bool stays;
      if (ay < tg22x) {
        stays = m > magnitude(x - 1, y) && m >= magnitude(x + 1, y);
      } else if (ay > tg22x + (ax << (kShift + 1))) {
        stays = m > magnitude(x, y - 1) && m >= magnitude(x, y + 1);
      } else {
        const int s = (xs ^ ys) < 0 ? -1 : 1;
        stays = m > magnitude(x - s, y - 1) && m > magnitude(x + s, y + 1);
      }
      if (!stays) continue;
      state[i] = 1;
      if (m > high) {
        state[i] = 2;
        stack.push_back(int64_t(i));
      }
    }

  // Hysteresis: every candidate 8-connected to an edge becomes one.
  while (!stack.empty()) {
    const int64_t i = stack.back();
    stack.pop_back();
    const int x = int(i % W), y = int(i / W);
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        const int nx = x + dx, ny = y + dy;
        if (nx < 0 || nx >= W || ny < 0 || ny >= H) continue;
        const size_t n = size_t(ny) * W + nx;
        if (state[n] == 1) {
          state[n] = 2;
          stack.push_back(int64_t(n));
        }
      }
  }
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      if (state[size_t(y) * W + x] == 2) {
        uint8_t* p = out.pixel(x, y);
        p[0] = p[1] = p[2] = 255;
      }
  return out;
}

}  // namespace klein
