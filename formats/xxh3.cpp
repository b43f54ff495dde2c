#include "formats/xxh3.h"

#include <xxhash.h>

#include <new>

#include "core/cpu.h"

namespace klein::xxh3 {

const Functions& library() {
  static const Functions f{
      "library",
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
  return f;
}

#if !defined(KLEIN_X86)
const Functions* avx2() { return nullptr; }
#endif

const Functions& best() {
  static const Functions& f = [] () -> const Functions& {
    const Functions* fast = avx2();
    return fast && cpu_features().avx2 ? *fast : library();
  }();
  return f;
}

Hasher::Hasher(const Functions& f) : f_(&f), state_(f.create()) {
  if (!state_) throw std::bad_alloc();
  reset();
}

}  // namespace klein::xxh3
