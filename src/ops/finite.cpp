#include "ops/finite.h"

#include <atomic>
#include <cmath>

namespace klein::ops {

bool all_finite(const float* x, int64_t n, Compute& cx) {
  std::atomic<bool> ok{true};
  cx.pool().parallel_for(n, [&](int64_t begin, int64_t end, int) {
    // x · 0 is 0 for every finite x and NaN for NaN and ±Inf: one multiply-add per value,
    // which the compiler vectorises, and one test per chunk.
    float probe = 0;
    for (int64_t i = begin; i < end; ++i) probe += x[i] * 0.0f;
    if (probe != 0) ok = false;
  }, 4096);
  return ok;
}

void require_finite(const float* x, int64_t n, const std::string& where, Compute& cx) {
  if (all_finite(x, n, cx)) return;
  int64_t first = 0;
  while (first < n && std::isfinite(x[first])) ++first;
  throw NonFinite(where + " holds non-finite values (value " + std::to_string(first) + " is " +
                  std::to_string(x[first]) + "); a weight or an input is NaN or infinite");
}

}  // namespace klein::ops
