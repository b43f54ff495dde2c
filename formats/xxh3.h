#pragma once
// XXH3-64 (xxHash's XXH3_64bits, seed 0), the checksum of the container format, at the speed
// of the widest vectors the CPU has. The system library is built for the baseline (SSE2 on
// x86-64, about 3 GB/s here); the same algorithm compiled for AVX2 or AVX-512 hashes two to
// three times as fast, which matters because every weight byte is hashed once per run (the
// container's first-acquire check). Every path gives the same value; the choice is made once,
// from the CPU's features, and KLEIN_ISA (core/cpu.h) narrows it like the other kernels.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

namespace klein::xxh3 {

uint64_t hash64(const void* data, size_t n);

// The same hash over data given in pieces.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void reset();
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  struct Free {
    void operator()(void* state) const;
  };
  std::unique_ptr<void, Free> state_;
};

// Which implementation runs: "avx512", "avx2" or "baseline".
std::string_view implementation();

namespace detail {
// One implementation of XXH3-64; each is the xxHash header compiled with other vector flags.
struct Functions {
  std::string_view name;
  uint64_t (*hash)(const void* data, size_t n);
  void* (*create)();
  void (*destroy)(void* state);
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t n);
  uint64_t (*digest)(const void* state);
};
const Functions& baseline();
#if defined(KLEIN_X86)
const Functions& avx2();
const Functions& avx512();
#endif
}  // namespace detail

}  // namespace klein::xxh3
