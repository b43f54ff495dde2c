#pragma once
// The GGUF format (versions 2 and 3, little-endian), as llama.cpp, ComfyUI-GGUF and
// stable-diffusion.cpp write it:
//
//   "GGUF"  u32 version  u64 tensor_count  u64 kv_count
//   kv_count x   string key, u32 value type, value
//   tensor_count x   string name, u32 n_dims, u64 ne[n_dims], u32 GGML type, u64 offset
//   padding to the alignment (metadata key general.alignment, u32, default 32)
//   data: each tensor at data start + offset (a multiple of the alignment)
//
// A string is a u64 byte count and the bytes (UTF-8, not terminated). A value is one of
// u8 i8 u16 i16 u32 i32 f32 bool string (types 0..8), u64 i64 f64 (10..12), or an array
// (9): u32 item type, u64 count, the items (arrays may nest).
//
// ne[0] is the innermost (contiguous) dimension, so a tensor of ne = [K, N] is our [N, K]:
// `shape` below is ne reversed. Quantized types are cut into blocks along ne[0].
//
// The file is mapped read-only and checked completely when opened: every count, string and
// array length against the bytes left, the alignment, each tensor's type, shape and bytes
// against the data area, no overlaps, unique names and keys. Errors name the file and the
// key or tensor.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/tensor.h"
#include "formats/gguf_types.h"

namespace klein::gguf {

enum class ValueType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  String = 8,
  Array = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars: integers and bools in `integer` (u64 values above the int64
// range are refused when read), floats in `real`, a string in `text`. Arrays: `item` is the
// type of the items, held in `integers`, `reals`, `strings` or `arrays` (nested) by type.
struct Value {
  ValueType type = ValueType::U8;
  int64_t integer = 0;
  double real = 0;
  std::string text;
  ValueType item = ValueType::U8;
  std::vector<int64_t> integers;
  std::vector<double> reals;
  std::vector<std::string> strings;
  std::vector<Value> arrays;

  bool is_integer() const;  // any integer type or bool
  uint64_t size() const;    // items of an array
};

struct TensorInfo {
  std::string name;
  TensorType type = TensorType::F32;
  std::vector<uint64_t> ne;  // as stored: innermost first
  Shape shape;               // ours: outermost first
  uint64_t begin = 0;        // absolute offset in the file
  uint64_t end = 0;
  int64_t rows() const;      // product of all dimensions but the innermost
  int64_t row_elems() const; // ne[0] (1 for a scalar)
  uint64_t row_bytes() const;
};

class File {
 public:
  explicit File(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_start() const { return data_start_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // The keys in file order and their values.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* value(const std::string& key) const;

  // Typed metadata look-ups: nullopt when the key is absent; a Error naming the file and key
  // when it is present with another type.
  std::optional<std::string> get_string(const std::string& key) const;
  std::optional<int64_t> get_integer(const std::string& key) const;
  const std::vector<std::string>* get_strings(const std::string& key) const;
  const std::vector<int64_t>* get_integers(const std::string& key) const;

  // The bytes of a tensor, and of one row (a run of ne[0] elements).
  const std::byte* data(const TensorInfo& t) const { return file_.data() + t.begin; }
  const std::byte* row(const TensorInfo& t, int64_t r) const;
  // Rows [first, first + count) of a tensor decoded to float32 (dst: count * row_elems()).
  void decode_rows(const TensorInfo& t, int64_t first, int64_t count, float* dst) const;
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::map<std::string, size_t> keys_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
};

// True when the file starts with the GGUF magic (a cheap test for choosing a reader).
bool looks_like_gguf(const std::filesystem::path& path);

}  // namespace klein::gguf
