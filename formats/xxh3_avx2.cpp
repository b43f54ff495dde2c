// XXH3 compiled for AVX2 (formats/xxh3.h).
#include "formats/xxh3.h"

#define XXH_VECTOR XXH_AVX2
#include "formats/xxh3_impl.inc"

namespace klein::xxh3::detail {

const Functions& avx2() {
  static const Functions f{"avx2", hash, create, destroy, reset, update, digest};
  return f;
}

}  // namespace klein::xxh3::detail
