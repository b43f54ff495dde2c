// XXH3 compiled for AVX-512 (formats/xxh3.h).
#include "formats/xxh3.h"

#define XXH_VECTOR XXH_AVX512
#include "formats/xxh3_impl.inc"

namespace klein::xxh3::detail {

const Functions& avx512() {
  static const Functions f{"avx512", hash, create, destroy, reset, update, digest};
  return f;
}

}  // namespace klein::xxh3::detail
