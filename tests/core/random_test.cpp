// core/random.h: the operating system's random bits. A source that repeats itself (as the
// RDSEED of a Zen 5 EPYC did through std::random_device, one draw in 400 to 600) or leaves
// bits unused fails here; a sound one fails with odds below 2^-30.
#include <gtest/gtest.h>

#include <cstdint>
#include <unordered_set>

#include "core/random.h"

namespace klein {
namespace {

TEST(OsRandom, NeverRepeatsAndUsesEveryBit) {
  constexpr int kDraws = 100000;
  std::unordered_set<uint64_t> seen;
  seen.reserve(kDraws);
  uint64_t any = 0, all = ~uint64_t(0), previous = 0;
  int repeats_in_a_row = 0;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t v = os_random_u64();
    if (i > 0 && v == previous) ++repeats_in_a_row;
    previous = v;
    seen.insert(v);
    any |= v;
    all &= v;
  }
  EXPECT_EQ(repeats_in_a_row, 0);
  // 10^5 draws of 64 bits collide with odds of about 3 * 10^-10.
  EXPECT_EQ(seen.size(), size_t(kDraws));
  EXPECT_EQ(any, ~uint64_t(0)) << "a bit that was never 1";
  EXPECT_EQ(all, uint64_t(0)) << "a bit that was never 0";
}

}  // namespace
}  // namespace klein
