#include "formats/gguf_files.h"

#include <gtest/gtest.h>

#include <fstream>

namespace klein::testing {

namespace {

struct Out {
  std::string bytes;
  void u32(uint32_t v) { bytes.append(reinterpret_cast<const char*>(&v), 4); }
  void u64(uint64_t v) { bytes.append(reinterpret_cast<const char*>(&v), 8); }
  void str(const std::string& s) {
    u64(s.size());
    bytes += s;
  }
};

struct GgmlType {
  uint32_t id;
  int64_t block_elems, block_bytes;  // values per block and its size
};

GgmlType ggml_type(const std::string& dtype) {
  if (dtype == "F32") return {0, 1, 4};
  if (dtype == "F16") return {1, 1, 2};
  if (dtype == "BF16") return {30, 1, 2};
  if (dtype == "Q8_0") return {8, 32, 34};
  if (dtype == "Q4_0") return {2, 32, 18};
  ADD_FAILURE() << "write_gguf: dtype " << dtype;
  return {0, 1, 4};
}

}  // namespace

void write_gguf(const std::filesystem::path& path, const std::vector<GgufKey>& metadata,
                const std::vector<StTensor>& tensors) {
  Out o;
  o.bytes = "GGUF";
  o.u32(3);
  o.u64(tensors.size());
  o.u64(metadata.size());
  for (const GgufKey& k : metadata) {
    o.str(k.key);
    if (auto* s = std::get_if<std::string>(&k.value)) {
      o.u32(8);
      o.str(*s);
    } else if (auto* u = std::get_if<uint32_t>(&k.value)) {
      o.u32(4);
      o.u32(*u);
    } else if (auto* ss = std::get_if<std::vector<std::string>>(&k.value)) {
      o.u32(9);
      o.u32(8);
      o.u64(ss->size());
      for (const auto& s2 : *ss) o.str(s2);
    } else {
      const auto& is = std::get<std::vector<int32_t>>(k.value);
      o.u32(9);
      o.u32(5);
      o.u64(is.size());
      for (int32_t v : is) o.u32(uint32_t(v));
    }
  }
  uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    const GgmlType type = ggml_type(t.dtype);
    // A file whose bytes disagree with its shape would test the reader's errors, not this.
    const bool whole_blocks =
        type.block_elems == 1 || (!t.shape.empty() && t.shape.back() % type.block_elems == 0);
    EXPECT_TRUE(whole_blocks &&
                int64_t(t.bytes.size()) == numel(t.shape) / type.block_elems * type.block_bytes)
        << "write_gguf: " << t.name << " holds " << t.bytes.size() << " bytes for its shape";
    o.str(t.name);
    o.u32(uint32_t(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) o.u64(uint64_t(*it));
    o.u32(type.id);
    o.u64(offset);
    offset = (offset + t.bytes.size() + 31) / 32 * 32;
  }
  o.bytes.resize((o.bytes.size() + 31) / 32 * 32, '\0');
  for (const StTensor& t : tensors) {
    o.bytes.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    o.bytes.resize((o.bytes.size() + 31) / 32 * 32, '\0');
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << "cannot write " << path;
  out.write(o.bytes.data(), std::streamsize(o.bytes.size()));
}

}  // namespace klein::testing
