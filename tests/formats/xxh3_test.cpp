// formats/xxh3.h: every implementation gives the system library's XXH3_64bits for every
// length (the algorithm has its own code for 0, 1-3, 4-8, 9-16, 17-128, 129-240 bytes and for
// longer inputs, by stripes and blocks), the streaming Hasher gives the one-shot value however
// the data is cut, and after reset() starts over.
#include "formats/xxh3.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu.h"

namespace klein::xxh3 {
namespace {

std::vector<const Functions*> implementations() {
  std::vector<const Functions*> all = {&library()};
  if (avx2() && cpu_features().avx2) all.push_back(avx2());
  return all;
}

TEST(Xxh3, TheAvx2BuildIsTakenWhereTheCpuHasAvx2) {
  if (!avx2()) GTEST_SKIP() << "no AVX2 build on this architecture";
  EXPECT_EQ(&best(), cpu_features().avx2 ? avx2() : &library());
}

TEST(Xxh3, EveryImplementationGivesTheLibrarysValueAtEveryLength) {
  std::mt19937 rng(5);
  std::vector<uint8_t> data(70000);
  for (auto& b : data) b = uint8_t(rng());
  for (const Functions* f : implementations()) {
    for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(4), size_t(8), size_t(9),
                     size_t(16), size_t(17), size_t(128), size_t(129), size_t(240), size_t(241),
                     size_t(1023), size_t(1024), size_t(1025), size_t(65536), data.size()}) {
      for (size_t offset : {size_t(0), size_t(1), size_t(7)}) {  // unaligned starts too
        if (offset + n > data.size()) continue;
        EXPECT_EQ(f->hash64(data.data() + offset, n), XXH3_64bits(data.data() + offset, n))
            << f->name << ", " << n << " bytes at offset " << offset;
      }
    }
  }
}

TEST(Xxh3, StreamingInAnyPiecesMatchesOneShot) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(300000);
  for (auto& b : data) b = uint8_t(rng());
  const uint64_t expected = XXH3_64bits(data.data(), data.size());
  EXPECT_EQ(expected, hash64(data.data(), data.size()));
  for (const Functions* f : implementations()) {
    Hasher h(*f);
    for (size_t max_piece : {size_t(1), size_t(63), size_t(257), size_t(5000), data.size()}) {
      h.reset();
      for (size_t at = 0; at < data.size();) {
        const size_t n = std::min(data.size() - at, size_t(rng() % max_piece) + 1);
        h.update(data.data() + at, n);
        at += n;
      }
      EXPECT_EQ(h.digest(), expected) << f->name << ", pieces of up to " << max_piece;
    }
    h.reset();
    EXPECT_EQ(h.digest(), XXH3_64bits(nullptr, 0)) << f->name;
  }
}

}  // namespace
}  // namespace klein::xxh3
