// libFuzzer target: the GGUF reader (header, metadata of every value type, tensor infos,
// alignment, offsets) and the decoding of the first row of every tensor whose type can be
// decoded. Every input must end in a parse or a klein::Error: never a crash, a hang or a
// huge allocation.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = klein::fuzz::as_file(data, size, ".gguf");
  try {
    const klein::gguf::File file(path);
    (void)file.get_string("general.architecture");
    std::vector<float> row;
    for (const auto& t : file.tensors()) {
      if (!klein::gguf::type_info(t.type).decodable || t.rows() == 0 || t.row_elems() > (1 << 16)) continue;
      row.resize(size_t(t.row_elems()));
      file.decode_rows(t, 0, 1, row.data());
    }
  } catch (const klein::Error&) {
  }
  return 0;
}
