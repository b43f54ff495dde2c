// formats/xxh3.h: the streaming Hasher gives the one-shot value however the data is cut, and
// after reset() starts over.
#include "formats/xxh3.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace klein::xxh3 {
namespace {

TEST(Xxh3, StreamingInAnyPiecesMatchesOneShot) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(300000);
  for (auto& b : data) b = uint8_t(rng());
  const uint64_t expected = hash64(data.data(), data.size());
  EXPECT_EQ(expected, XXH3_64bits(data.data(), data.size()));
  Hasher h;
  for (size_t max_piece : {size_t(1), size_t(63), size_t(257), size_t(5000), data.size()}) {
    h.reset();
    for (size_t at = 0; at < data.size();) {
      const size_t n = std::min(data.size() - at, size_t(rng() % max_piece) + 1);
      h.update(data.data() + at, n);
      at += n;
    }
    EXPECT_EQ(h.digest(), expected) << "pieces of up to " << max_piece;
  }
  h.reset();
  EXPECT_EQ(h.digest(), hash64(nullptr, 0));
}

}  // namespace
}  // namespace klein::xxh3
