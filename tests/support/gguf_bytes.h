#pragma once
// GGUF bytes as tests write them, field by field (little-endian, as the host): the header, the
// metadata's strings and numbers, a tensor's info record and the alignment padding. Tests that
// check the reader's errors write each field as they need it; tests/formats/gguf_files.h builds
// whole files on it.
#include <cstdint>
#include <string>
#include <vector>

namespace klein::testing {

struct GgufBytes {
  std::string bytes;

  void u32(uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); }
  // A GGUF string: its length as u64, then its bytes.
  void str(const std::string& s) {
    u64(s.size());
    bytes += s;
  }
  // "GGUF", the version, the tensor count and the metadata count.
  void header(uint64_t tensors, uint64_t kvs, uint32_t version = 3) {
    bytes += "GGUF";
    u32(version);
    u64(tensors);
    u64(kvs);
  }
  // A tensor info: name, dimension count, ne (innermost first), GGML type, data offset.
  void tensor(const std::string& name, const std::vector<uint64_t>& ne, uint32_t type,
              uint64_t offset) {
    str(name);
    u32(uint32_t(ne.size()));
    for (uint64_t n : ne) u64(n);
    u32(type);
    u64(offset);
  }
  // Zero bytes up to the next multiple of `align`.
  void pad(size_t align = 32) { bytes.resize((bytes.size() + align - 1) / align * align, '\0'); }
};

}  // namespace klein::testing
