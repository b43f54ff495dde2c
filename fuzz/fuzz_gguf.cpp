// libFuzzer target: the GGUF reader (header, metadata of every value type, tensor infos,
// alignment, offsets), the decoding of the first row of every tensor whose type can be
// decoded, the tokenizer files made from the metadata and the text-encoder name mapping.
// Every input must end in a parse or a klein::Error: never a crash, a hang or a huge
// allocation.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "fuzz/fuzz_support.h"
#include "weights/container_store.h"
#include "weights/gguf_source.h"

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
    std::map<std::string, std::string> names;
    (void)klein::gguf_tensor_names(klein::Component::TextEncoder, file, names);
  } catch (const klein::Error&) {
  }
  try {
    (void)klein::gguf_tokenizer(klein::gguf::File(path));
  } catch (const klein::Error&) {
  }
  return 0;
}
