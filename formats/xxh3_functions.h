#pragma once
// For formats/xxh3.cpp and formats/xxh3_avx2.cpp only, included after <xxhash.h>: the table
// of the XXH3 functions that the header's names stand for in the including file (the system
// library's, or under XXH_INLINE_ALL that file's own compiled copies). Internal linkage, so
// that each file gets the table of its own functions.
#include "formats/xxh3.h"

#if !defined(XXH_VERSION_NUMBER)
#error "include <xxhash.h> first"
#endif

namespace klein::xxh3 {
namespace {

Functions functions_in_scope(const char* name) {
  return {name,
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
}

}  // namespace
}  // namespace klein::xxh3
