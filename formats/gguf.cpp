#include "formats/gguf.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"

namespace klein::gguf {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxNesting = 8;           // arrays of arrays of ... (real files use 1)
constexpr uint64_t kMaxElements = 1ull << 50;

// Reads little-endian values from the header, each checked against the bytes left. `what`
// says what is being read, for the message.
class Cursor {
 public:
  Cursor(const std::byte* data, uint64_t size, const std::string& where)
      : p_(reinterpret_cast<const uint8_t*>(data)), size_(size), where_(where) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    check(n <= left(), where_, ": ", what, " needs ", n, " bytes at offset ", pos_, " but the file has ",
          left(), " left (truncated?)");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));  // GGUF v2/v3 as read here are little-endian
    pos_ += sizeof(T);
    return v;
  }
  std::string string(const std::string& what) {
    const uint64_t n = read<uint64_t>(what + " (its length)");
    need(n, what + " (a string of " + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(n));
    pos_ += n;
    return s;
  }
  // A count of items each taking at least `min_bytes`: more than fit in the rest of the file
  // is an error before anything is allocated for them.
  uint64_t count(const std::string& what, uint64_t min_bytes) {
    const uint64_t n = read<uint64_t>(what);
    check(min_bytes == 0 || n <= left() / min_bytes, where_, ": ", what, " is ", n,
          " but the file has room for at most ", min_bytes ? left() / min_bytes : 0, " (corrupt or truncated)");
    return n;
  }

 private:
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& where_;
};

// Bytes of one scalar of a fixed-size value type; 0 for strings and arrays.
uint64_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::Bool: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

ValueType value_type(uint32_t id, const std::string& where, const std::string& key) {
  check(id <= 12, where, ": metadata ", key, ": unknown value type ", id, " (GGUF defines 0..12)");
  return ValueType(id);
}

// Reads an integer, float or bool scalar of type t into v.
void read_scalar(Cursor& c, ValueType t, Value& v, const std::string& where, const std::string& what) {
  switch (t) {
    case ValueType::U8: v.integer = c.read<uint8_t>(what); break;
    case ValueType::I8: v.integer = c.read<int8_t>(what); break;
    case ValueType::U16: v.integer = c.read<uint16_t>(what); break;
    case ValueType::I16: v.integer = c.read<int16_t>(what); break;
    case ValueType::U32: v.integer = c.read<uint32_t>(what); break;
    case ValueType::I32: v.integer = c.read<int32_t>(what); break;
    case ValueType::I64: v.integer = c.read<int64_t>(what); break;
    case ValueType::U64: {
      const uint64_t u = c.read<uint64_t>(what);
      check(u <= uint64_t(INT64_MAX), where, ": ", what, ": u64 value ", u, " is out of range");
      v.integer = int64_t(u);
      break;
    }
    case ValueType::Bool: {
      const uint8_t b = c.read<uint8_t>(what);
      check(b <= 1, where, ": ", what, ": a bool holds ", int(b), " (expected 0 or 1)");
      v.integer = b;
      break;
    }
    case ValueType::F32: v.real = c.read<float>(what); break;
    case ValueType::F64: v.real = c.read<double>(what); break;
    default: fail(where, ": ", what, ": not a scalar type");
  }
}

Value read_value(Cursor& c, ValueType t, const std::string& where, const std::string& key, int depth) {
  Value v;
  v.type = t;
  const std::string what = "metadata " + key;
  if (t == ValueType::String) {
    v.text = c.string(what);
  } else if (t == ValueType::Array) {
    check(depth < kMaxNesting, where, ": ", what, ": arrays nested deeper than ", kMaxNesting);
    v.item = value_type(c.read<uint32_t>(what + " (array item type)"), where, key);
    const uint64_t fixed = scalar_bytes(v.item);
    // Strings take at least their 8-byte length, arrays their 12-byte head.
    const uint64_t min_bytes = fixed ? fixed : v.item == ValueType::String ? 8 : 12;
    const uint64_t n = c.count(what + " (array length)", min_bytes);
    if (v.item == ValueType::String) {
      v.strings.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.strings.push_back(c.string(what + "[" + std::to_string(i) + "]"));
    } else if (v.item == ValueType::Array) {
      v.arrays.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) v.arrays.push_back(read_value(c, ValueType::Array, where, key, depth + 1));
    } else {
      const bool real = v.item == ValueType::F32 || v.item == ValueType::F64;
      (real ? v.reals.reserve(size_t(n)) : v.integers.reserve(size_t(n)));
      Value item;
      for (uint64_t i = 0; i < n; ++i) {
        read_scalar(c, v.item, item, where, what + "[" + std::to_string(i) + "]");
        if (real)
          v.reals.push_back(item.real);
        else
          v.integers.push_back(item.integer);
      }
    }
  } else {
    read_scalar(c, t, v, where, what);
  }
  return v;
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* const names[] = {"u8", "i8",     "u16",   "i16", "u32", "i32", "f32",
                                      "bool", "string", "array", "u64", "i64", "f64"};
  return uint32_t(t) <= 12 ? names[uint32_t(t)] : "unknown";
}

bool Value::is_integer() const {
  return type != ValueType::F32 && type != ValueType::F64 && type != ValueType::String &&
         type != ValueType::Array;
}

uint64_t Value::size() const {
  return integers.size() + reals.size() + strings.size() + arrays.size();
}

int64_t TensorInfo::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < ne.size(); ++i) r *= int64_t(ne[i]);
  return r;
}

int64_t TensorInfo::row_elems() const { return ne.empty() ? 1 : int64_t(ne[0]); }

uint64_t TensorInfo::row_bytes() const {
  const TypeInfo& info = type_info(type);
  return uint64_t(row_elems()) / info.block_elems * info.block_bytes;
}

File::File(const fs::path& path) : file_(path) {
  const std::string where = path.string();
  Cursor c(file_.data(), file_.size(), where);
  check(file_.size() >= 4, where, ": file of ", file_.size(), " bytes is too small to be GGUF");
  const uint32_t magic = c.read<uint32_t>("the magic");
  check(magic == kMagic, where, ": not a GGUF file (it does not start with \"GGUF\")");
  version_ = c.read<uint32_t>("the version");
  check(version_ != 1, where, ": GGUF version 1 (32-bit counts, 2023) is not supported; versions 2 and 3 are");
  check((version_ & 0xffff) != 0 || version_ == 0, where, ": GGUF version ", version_,
        " looks byte-swapped: big-endian GGUF files are not supported");
  check(version_ == 2 || version_ == 3, where, ": GGUF version ", version_, " is not supported (2 and 3 are)");

  // A tensor info takes at least 8 (name length) + 4 + 4 + 8 bytes, a key-value pair at
  // least 8 (key length) + 4 + 1.
  const uint64_t n_tensors = c.count("the tensor count", 24);
  const uint64_t n_kv = c.count("the metadata count", 13);

  metadata_.reserve(size_t(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.string("metadata key " + std::to_string(i));
    const ValueType t = value_type(c.read<uint32_t>("metadata " + key + " (value type)"), where, key);
    Value v = read_value(c, t, where, key, 0);
    check(keys_.emplace(key, metadata_.size()).second, where, ": metadata key ", key, " appears twice");
    metadata_.emplace_back(std::move(key), std::move(v));
  }

  if (const Value* a = value("general.alignment")) {
    check(a->type == ValueType::U32, where, ": general.alignment is a ", value_type_name(a->type),
          " (expected u32)");
    check(a->integer > 0 && (a->integer & (a->integer - 1)) == 0, where, ": general.alignment ", a->integer,
          " is not a power of two");
    alignment_ = uint32_t(a->integer);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = c.string("tensor info " + std::to_string(i) + " (its name)");
    const std::string what = "tensor " + t.name;
    const uint32_t n_dims = c.read<uint32_t>(what + " (dimension count)");
    check(n_dims <= kMaxDims, where, ": ", what, " has ", n_dims, " dimensions (at most ", kMaxDims, ")");
    uint64_t count = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t n = c.read<uint64_t>(what + " (dimensions)");
      check(n < (1ull << 40) && (n == 0 || count <= kMaxElements / n), where, ": ", what,
            ": dimension ", n, " makes the tensor absurdly large");
      count *= n;
      t.ne.push_back(n);
    }
    const uint32_t type_id = c.read<uint32_t>(what + " (type)");
    const auto info = type_info(type_id);
    check(info.has_value(), where, ": ", what, ": unknown GGML type ", type_id);
    t.type = info->type;
    const uint64_t offset = c.read<uint64_t>(what + " (data offset)");
    check(offset % alignment_ == 0, where, ": ", what, ": data offset ", offset,
          " is not a multiple of the alignment ", alignment_);
    const uint64_t inner = t.ne.empty() ? 1 : t.ne[0];
    check(inner % info->block_elems == 0, where, ": ", what, ": its innermost dimension ", inner,
          " is not a multiple of the ", info->name, " block of ", info->block_elems, " elements");
    const uint64_t bytes = count / info->block_elems * info->block_bytes;
    t.begin = offset;  // relative to the data start until it is known
    t.end = offset + bytes;
    check(t.end >= offset, where, ": ", what, ": data offset ", offset, " overflows");
    for (auto it = t.ne.rbegin(); it != t.ne.rend(); ++it) t.shape.push_back(int64_t(*it));
    check(index_.emplace(t.name, tensors_.size()).second, where, ": tensor ", t.name, " appears twice");
    tensors_.push_back(std::move(t));
  }

  data_start_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  const uint64_t size = file_.size();
  check(tensors_.empty() || data_start_ <= size, where, ": the data area would start at ", data_start_,
        " past the end of the file (", size, " bytes; truncated?)");
  for (TensorInfo& t : tensors_) {
    check(t.end <= size - std::min(size, data_start_) && data_start_ <= size, where, ": tensor ", t.name,
          ": its data [", t.begin, ", ", t.end, ") lies past the end of the data area of ",
          size - std::min(size, data_start_), " bytes (truncated?)");
    t.begin += data_start_;
    t.end += data_start_;
  }
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors_)
    if (t.begin < t.end) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
  const TensorInfo* reach = nullptr;
  for (const TensorInfo* t : by_offset) {
    check(reach == nullptr || t->begin >= reach->end, where, ": tensors ", reach ? reach->name : "",
          " and ", t->name, " overlap in the data area");
    if (reach == nullptr || t->end > reach->end) reach = t;
  }
}

const TensorInfo* File::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const Value* File::value(const std::string& key) const {
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &metadata_[it->second].second;
}

std::optional<std::string> File::get_string(const std::string& key) const {
  const Value* v = value(key);
  if (v == nullptr) return std::nullopt;
  check(v->type == ValueType::String, path().string(), ": metadata ", key, " is a ", value_type_name(v->type),
        " (expected a string)");
  return v->text;
}

std::optional<int64_t> File::get_integer(const std::string& key) const {
  const Value* v = value(key);
  if (v == nullptr) return std::nullopt;
  check(v->is_integer(), path().string(), ": metadata ", key, " is a ", value_type_name(v->type),
        " (expected an integer)");
  return v->integer;
}

const std::vector<std::string>* File::get_strings(const std::string& key) const {
  const Value* v = value(key);
  if (v == nullptr) return nullptr;
  check(v->type == ValueType::Array && v->item == ValueType::String, path().string(), ": metadata ", key,
        " is not an array of strings");
  return &v->strings;
}

const std::vector<int64_t>* File::get_integers(const std::string& key) const {
  const Value* v = value(key);
  if (v == nullptr) return nullptr;
  const bool ok = v->type == ValueType::Array && v->item != ValueType::String && v->item != ValueType::Array &&
                  v->item != ValueType::F32 && v->item != ValueType::F64;
  check(ok, path().string(), ": metadata ", key, " is not an array of integers");
  return &v->integers;
}

const std::byte* File::row(const TensorInfo& t, int64_t r) const {
  return file_.data() + t.begin + uint64_t(r) * t.row_bytes();
}

void File::decode_rows(const TensorInfo& t, int64_t first, int64_t count, float* dst) const {
  check(first >= 0 && count >= 0 && first + count <= t.rows(), path().string(), ": tensor ", t.name, ": rows [",
        first, ", ", first + count, ") of ", t.rows());
  const int64_t n = t.row_elems();
  try {
    for (int64_t r = 0; r < count; ++r) decode_row(t.type, row(t, first + r), dst + r * n, n);
  } catch (const Error& e) {
    fail(path().string(), ": tensor ", t.name, ": ", e.what());
  }
}

bool looks_like_gguf(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace klein::gguf
