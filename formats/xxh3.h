#pragma once
// XXH3-64 (xxHash's XXH3_64bits, seed 0), the checksum of the container format: one-shot, or
// over data given in pieces (Hasher). Two implementations of the same function (the algorithm
// is defined bit for bit): the algorithm from the system xxHash header compiled for AVX2
// (formats/xxh3_avx2.cpp), taken on x86 CPUs with AVX2, and the system library otherwise
// (it runs the SSE2 code on x86-64: 5.7 GB/s against 10.5 GB/s for the AVX2 build on 256 MiB
// in memory on an AVX-512 Xeon, which matters since paged units are hashed every step;
// docs/SPEED.md).
#include <cstddef>
#include <cstdint>

namespace klein::xxh3 {

// One implementation; `state` is its own XXH3 state, made by create().
struct Functions {
  const char* name;
  uint64_t (*hash64)(const void* data, size_t n);
  void* (*create)();  // nullptr when out of memory
  void (*destroy)(void* state);
  void (*reset)(void* state);
  void (*update)(void* state, const void* data, size_t n);
  uint64_t (*digest)(const void* state);
};

const Functions& library();  // the system library
const Functions* avx2();     // the AVX2 build; nullptr where not compiled in
const Functions& best();     // the AVX2 build where the CPU has AVX2, else the library

inline uint64_t hash64(const void* data, size_t n) { return best().hash64(data, n); }

// The same hash over data given in pieces.
class Hasher {
 public:
  explicit Hasher(const Functions& f = best());
  ~Hasher() { f_->destroy(state_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  void reset() { f_->reset(state_); }
  void update(const void* data, size_t n) { f_->update(state_, data, n); }
  uint64_t digest() const { return f_->digest(state_); }

 private:
  const Functions* f_;
  void* state_;
};

}  // namespace klein::xxh3
