// formats/xxh3.h: every implementation (baseline, AVX2, AVX-512) gives the system xxHash
// library's XXH3_64bits for every length class of the algorithm, at any alignment, one-shot
// and streamed in pieces of any size.
#include "formats/xxh3.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu.h"

namespace klein::xxh3 {
namespace {

std::vector<const detail::Functions*> implementations() {
  std::vector<const detail::Functions*> out = {&detail::baseline()};
#if defined(KLEIN_X86)
  if (cpu_features().avx2) out.push_back(&detail::avx2());
  if (cpu_features().avx512) out.push_back(&detail::avx512());
#endif
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

// XXH3 has separate code for 0, 1-3, 4-8, 9-16, 17-128, 129-240 bytes, then stripes of 64 and
// blocks of 1024 bytes: every length up to 2100 crosses all of them.
TEST(Xxh3, EveryImplementationMatchesTheLibrary) {
  const std::vector<uint8_t> data = random_bytes(3 << 20, 1);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 2100; ++n) lengths.push_back(n);
  for (size_t n : {size_t(4095), size_t(65536), size_t(1 << 20) + 7, data.size() - 3})
    lengths.push_back(n);
  for (const detail::Functions* f : implementations()) {
    for (size_t offset : {0, 1, 3}) {
      for (size_t n : lengths) {
        if (offset + n > data.size()) continue;
        ASSERT_EQ(f->hash(data.data() + offset, n), XXH3_64bits(data.data() + offset, n))
            << f->name << ": " << n << " bytes at offset " << offset;
      }
    }
  }
}

TEST(Xxh3, StreamingInAnyPiecesMatchesOneShot) {
  const std::vector<uint8_t> data = random_bytes(300000, 2);
  const uint64_t expected = XXH3_64bits(data.data(), data.size());
  std::mt19937 rng(3);
  for (const detail::Functions* f : implementations()) {
    void* state = f->create();
    for (size_t max_piece : {size_t(1), size_t(63), size_t(257), size_t(5000), data.size()}) {
      f->reset(state);
      for (size_t at = 0; at < data.size();) {
        const size_t n = std::min(data.size() - at, size_t(rng() % max_piece) + 1);
        f->update(state, data.data() + at, n);
        at += n;
      }
      EXPECT_EQ(f->digest(state), expected) << f->name << ", pieces of up to " << max_piece;
    }
    f->destroy(state);
  }
}

TEST(Xxh3, PublicInterfaceUsesTheWidestImplementation) {
  const std::vector<uint8_t> data = random_bytes(10000, 4);
  EXPECT_EQ(hash64(data.data(), data.size()), XXH3_64bits(data.data(), data.size()));
  Hasher h;
  h.update(data.data(), 4000);
  h.update(data.data() + 4000, 6000);
  EXPECT_EQ(h.digest(), XXH3_64bits(data.data(), data.size()));
  h.reset();
  EXPECT_EQ(h.digest(), XXH3_64bits(nullptr, 0));
#if defined(KLEIN_X86)
  const std::string_view widest = cpu_features().avx512 ? "avx512"
                                  : cpu_features().avx2 ? "avx2"
                                                        : "baseline";
  EXPECT_EQ(implementation(), widest);
#else
  EXPECT_EQ(implementation(), "baseline");
#endif
}

}  // namespace
}  // namespace klein::xxh3
