// XXH3-64 compiled for AVX2 (with -mavx2, this file only) from the system xxHash header's
// inline implementation: the same algorithm as the library, under private names
// (XXH_INLINE_ALL), with the AVX2 accumulate and scramble loops.
#define XXH_INLINE_ALL
#include <xxhash.h>

#if !defined(__AVX2__)
#error "compile this file with -mavx2"
#endif

#include "formats/xxh3.h"

namespace klein::xxh3 {

const Functions* avx2() {
  static const Functions f{
      "avx2",
      [](const void* data, size_t n) -> uint64_t { return XXH3_64bits(data, n); },
      []() -> void* { return XXH3_createState(); },
      [](void* s) { XXH3_freeState(static_cast<XXH3_state_t*>(s)); },
      [](void* s) { XXH3_64bits_reset(static_cast<XXH3_state_t*>(s)); },
      [](void* s, const void* data, size_t n) {
        XXH3_64bits_update(static_cast<XXH3_state_t*>(s), data, n);
      },
      [](const void* s) -> uint64_t {
        return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(s));
      }};
  return &f;
}

}  // namespace klein::xxh3
