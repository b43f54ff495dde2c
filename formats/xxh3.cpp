#include "formats/xxh3.h"

#include <xxhash.h>

#include <new>

#include "core/cpu.h"
#include "formats/xxh3_functions.h"  // after <xxhash.h>: the library's functions

namespace klein::xxh3 {

const Functions& library() {
  static const Functions f = functions_in_scope("library");
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
