#pragma once
// Non-finite values (NaN, ±Inf) caught where they appear instead of ending in a flat image:
// a corrupt weight, an overflow or a bad input makes the stage that sees it fail, naming
// itself. The check reads the values once, split over the pool (about a millisecond for a
// transformer block's stream at 256x256).
#include <cstdint>
#include <string>

#include "ops/compute.h"

namespace klein::ops {

// Thrown when a check finds a NaN or an infinity.
class NonFinite : public Error {
 public:
  using Error::Error;
};

bool all_finite(const float* x, int64_t n, Compute& cx);

// Throws NonFinite("<where> ...") unless every value is finite.
void require_finite(const float* x, int64_t n, const std::string& where, Compute& cx);

}  // namespace klein::ops
