// libFuzzer target: the GGUF reader (header, metadata of every value type, tensor infos,
// alignment, offsets), the decoding of the first row of every tensor whose type can be
// decoded, the tokenizer files made from the metadata, the text-encoder name mapping and the
// facts a llama-architecture text encoder's metadata gives (head width, RoPE, epsilon, the
// heads its q/k rows were interleaved over).
// Every input must end in a parse or a klein::Error: never a crash, a hang or a huge
// allocation.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"
#include "fuzz/fuzz_support.h"
#include "weights/container_store.h"
#include "weights/gguf_source.h"

// Each step on its own: a file the name mapping refuses (the seeds are not whole text
// encoders) still reaches the metadata readers after it.
template <class Step>
void attempt(Step step) {
  try {
    step();
  } catch (const klein::Error&) {
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = klein::fuzz::as_file(data, size, ".gguf");
  std::optional<klein::gguf::File> opened;
  attempt([&] { opened.emplace(path); });
  if (opened) {
    const klein::gguf::File& file = *opened;
    attempt([&] { (void)file.get_string("general.architecture"); });
    attempt([&] {
      std::vector<float> row;
      for (const auto& t : file.tensors()) {
        if (!klein::gguf::type_info(t.type).decodable || t.rows() == 0 || t.row_elems() > (1 << 16))
          continue;
        row.resize(size_t(t.row_elems()));
        file.decode_rows(t, 0, 1, row.data());
      }
    });
    attempt([&] {
      std::map<std::string, std::string> names;
      (void)klein::gguf_tensor_names(klein::Component::TextEncoder, file, names);
    });
    attempt([&] { (void)klein::gguf_text_facts(file); });
    for (const char* name : {"model.layers.0.self_attn.q_proj.weight",
                             "model.layers.0.self_attn.k_proj.weight"})
      attempt([&] { (void)klein::gguf_rope_interleaved_heads(file, name); });
  }
  try {
    (void)klein::gguf_tokenizer(klein::gguf::File(path));
  } catch (const klein::Error&) {
  }
  return 0;
}
