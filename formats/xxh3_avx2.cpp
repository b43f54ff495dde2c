// XXH3-64 compiled for AVX2 (with -mavx2, this file only) from the system xxHash header's
// inline implementation: the same algorithm as the library, under private names
// (XXH_INLINE_ALL), with the AVX2 accumulate and scramble loops.
#define XXH_INLINE_ALL
#include <xxhash.h>

#if !defined(__AVX2__)
#error "compile this file with -mavx2"
#endif

#include "formats/xxh3.h"
#include "formats/xxh3_functions.h"

namespace klein::xxh3 {

const Functions* avx2() {
  static const Functions f = functions_in_scope("avx2");
  return &f;
}

}  // namespace klein::xxh3
