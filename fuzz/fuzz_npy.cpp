// libFuzzer target: the .npy reader (magic, version, header dict, dtype, shape, data size)
// and its conversions, as --noise and the golden tests use it.
#include <cstdint>

#include "core/error.h"
#include "core/npy.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const klein::NpyArray a = klein::read_npy(klein::fuzz::as_file(data, size, ".npy"));
    if (a.dtype == klein::DType::F32 || a.numel() < 4096) (void)a.to_f32();
  } catch (const klein::Error&) {
  }
  return 0;
}
