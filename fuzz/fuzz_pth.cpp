// libFuzzer target: the .pth reader (formats/pth.h): the zip's end records and central
// directory, the local headers, the pickle interpreter of data.pkl (formats/torch_pickle.h),
// the storages each tensor refers to, and every tensor view. Every input must end in a parse
// or a klein::Error: never a crash, a hang or a huge allocation.
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/error.h"
#include "formats/pth.h"
#include "formats/torch_pickle.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = klein::fuzz::as_file(data, size, ".pth");
  try {
    const klein::PthFile file(path);
    float sink = 0;
    for (const auto& e : file.entries()) {
      const klein::TensorView v = file.view(e);
      if (klein::dtype_is_float(v.dtype) && v.numel() > 0) {
        float last;  // the tensor's last element: its whole span must be in the file
        klein::to_f32(v.dtype,
                      static_cast<const std::byte*>(v.data) + v.nbytes - klein::dtype_size(v.dtype),
                      &last, 1);
        sink += last;
      }
    }
    (void)sink;
  } catch (const klein::Error&) {
  }
  try {  // the same bytes as a bare pickle, so the interpreter is reached without a zip
    (void)klein::read_torch_state_dict_pickle(
        std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz input");
  } catch (const klein::Error&) {
  }
  return 0;
}
