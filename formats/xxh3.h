#pragma once
// XXH3-64 (xxHash's XXH3_64bits, seed 0), the checksum of the container format, from the
// system xxHash library: one-shot, or over data given in pieces (Hasher). The library picks
// its own vector code; measured on an AVX2 machine at 7.0 GB/s against 8.1 GB/s for the
// algorithm compiled for AVX2 (docs/SPEED.md), well above the rate units are paged in.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace klein::xxh3 {

inline uint64_t hash64(const void* data, size_t n) { return XXH3_64bits(data, n); }

// The same hash over data given in pieces.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState()) {
    if (!state_) throw std::bad_alloc();
    reset();
  }
  void reset() { XXH3_64bits_reset(state_.get()); }
  void update(const void* data, size_t n) { XXH3_64bits_update(state_.get(), data, n); }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_;
};

}  // namespace klein::xxh3
