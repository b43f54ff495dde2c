#include "ops/finite.h"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace klein::ops {

bool all_finite(const float* x, int64_t n, Compute& cx) {
  std::atomic<bool> ok{true};
  cx.pool().parallel_for(n, [&](int64_t begin, int64_t end, int) {
    // NaN and ±Inf are the values whose exponent bits are all ones. An OR of integer flags
    // is a reduction the compiler vectorises (a running float sum is not: its adds must stay
    // in order), and one test per chunk.
    uint32_t bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, x + i, sizeof bits);
      bad |= uint32_t((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) ok = false;
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
