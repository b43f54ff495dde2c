#include "formats/container/format.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "core/error.h"
#include "formats/xxh3.h"

namespace klein::container {

namespace {

// Little-endian field access on byte buffers.
class Out {
 public:
  explicit Out(std::vector<std::byte>& buf) : buf_(buf) {}
  void u8(uint8_t v) { buf_.push_back(std::byte(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void u64(uint64_t v) { put(v, 8); }
  void bytes(const std::string& s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    buf_.insert(buf_.end(), p, p + s.size());
  }

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) buf_.push_back(std::byte((v >> (8 * i)) & 0xff));
  }
  std::vector<std::byte>& buf_;
};

// Reads fields from a span; running past the end is an error naming `what` (the record
// being read) rather than a crash.
class In {
 public:
  In(std::span<const std::byte> bytes, const std::string& where) : bytes_(bytes), where_(where) {}
  uint8_t u8(const std::string& what) { return uint8_t(get(1, what)); }
  uint16_t u16(const std::string& what) { return uint16_t(get(2, what)); }
  uint32_t u32(const std::string& what) { return uint32_t(get(4, what)); }
  uint64_t u64(const std::string& what) { return get(8, what); }
  std::string str(size_t n, const std::string& what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

 private:
  void need(size_t n, const std::string& what) {
    check(n <= remaining(), where_, ": index ends inside ", what, " (", remaining(),
          " bytes left, ", n, " needed): the index is truncated or corrupt");
  }
  uint64_t get(int n, const std::string& what) {
    need(size_t(n), what);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= uint64_t(std::to_integer<uint8_t>(bytes_[pos_ + i])) << (8 * i);
    pos_ += size_t(n);
    return v;
  }
  std::span<const std::byte> bytes_;
  const std::string& where_;
  size_t pos_ = 0;
};

uint64_t read_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

// [offset, offset + size) inside [0, limit), without overflow.
bool inside(uint64_t offset, uint64_t size, uint64_t limit) {
  return offset <= limit && size <= limit - offset;
}

std::string range_str(uint64_t offset, uint64_t size) {
  std::string s = "[";
  s += std::to_string(offset);
  s += ", ";
  s += std::to_string(offset + size);
  s += ")";
  return s;
}

bool valid_name(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (static_cast<unsigned char>(c) < 0x20) return false;
  return true;
}

}  // namespace

uint8_t storage_code(DType t) {
  switch (t) {
    case DType::F32: return uint8_t(StorageCode::F32);
    case DType::F16: return uint8_t(StorageCode::F16);
    case DType::BF16: return uint8_t(StorageCode::BF16);
    case DType::Q8: return uint8_t(StorageCode::Q8);
    case DType::Q4: return uint8_t(StorageCode::Q4);
    default: break;
  }
  fail("a container cannot store tensors of type ", dtype_name(t),
       " (storage types: F32, F16, BF16, Q8, Q4)");
}

bool dtype_of_code(uint8_t code, DType& out) {
  switch (StorageCode(code)) {
    case StorageCode::F32: out = DType::F32; return true;
    case StorageCode::F16: out = DType::F16; return true;
    case StorageCode::BF16: out = DType::BF16; return true;
    case StorageCode::Q8: out = DType::Q8; return true;
    case StorageCode::Q4: out = DType::Q4; return true;
  }
  return false;
}

uint64_t xxh3(const void* data, size_t n) { return xxh3::hash64(data, n); }

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The header's 64-bit fields in file order, from byte 16 on (after magic, version and size).
constexpr uint64_t Header::*kHeaderWords[] = {
    &Header::flags,           &Header::file_size,     &Header::alignment,
    &Header::metadata_offset, &Header::metadata_size, &Header::metadata_raw_size,
    &Header::metadata_xxh3,   &Header::index_offset,  &Header::index_size,
    &Header::index_xxh3,      &Header::data_offset,   &Header::data_size};
constexpr size_t kHeaderWordsEnd = 16 + 8 * std::size(kHeaderWords);  // then the two counts

std::array<std::byte, kHeaderSize> encode_header(const Header& h) {
  std::vector<std::byte> buf;
  buf.reserve(kHeaderSize);
  Out o(buf);
  for (uint8_t b : kMagic) o.u8(b);
  o.u16(h.major);
  o.u16(h.minor);
  o.u32(uint32_t(kHeaderSize));
  for (uint64_t Header::*field : kHeaderWords) o.u64(h.*field);
  o.u32(h.unit_count);
  o.u32(h.tensor_count);
  o.u64(xxh3(buf.data(), buf.size()));
  check(buf.size() == kHeaderSize, "internal: container header is ", buf.size(), " bytes");
  std::array<std::byte, kHeaderSize> out;
  std::memcpy(out.data(), buf.data(), kHeaderSize);
  return out;
}

std::vector<std::byte> encode_index(const Index& index) {
  std::vector<std::byte> buf;
  Out o(buf);
  for (const auto& u : index.units) {
    check(valid_name(u.name) && u.name.size() <= kMaxNameBytes, "unit name \"", u.name,
          "\" cannot be stored");
    o.u16(uint16_t(u.name.size()));
    o.bytes(u.name);
    o.u32(u.first_tensor);
    o.u32(u.tensor_count);
    o.u64(u.offset);
    o.u64(u.size);
    o.u64(u.xxh3);
  }
  for (const auto& t : index.tensors) {
    check(valid_name(t.name) && t.name.size() <= kMaxNameBytes, "tensor name \"", t.name,
          "\" cannot be stored");
    check(t.shape.size() <= kMaxDims, "tensor ", t.name, " has ", t.shape.size(),
          " dimensions; a container holds at most ", kMaxDims);
    o.u16(uint16_t(t.name.size()));
    o.bytes(t.name);
    o.u8(storage_code(t.type));
    o.u8(t.layout);
    o.u8(uint8_t(t.shape.size()));
    o.u8(0);
    o.u32(t.block_size);
    for (int64_t d : t.shape) o.u64(uint64_t(d));
    o.u64(t.offset);
    o.u64(t.size);
    o.u64(t.xxh3);
  }
  return buf;
}

bool has_magic(std::span<const std::byte> bytes) {
  if (bytes.size() < kMagic.size()) return false;
  for (size_t i = 0; i < kMagic.size(); ++i)
    if (std::to_integer<uint8_t>(bytes[i]) != kMagic[i]) return false;
  return true;
}

Header decode_header(std::span<const std::byte> bytes, uint64_t actual_size,
                     const std::string& where) {
  check(has_magic(bytes), where,
        ": not a klein container (the file does not start with the "
        "container magic 89 4B 4C 45 49 4E 0D 0A)");
  check(bytes.size() >= 16, where, ": truncated: ", bytes.size(),
        " bytes, shorter than the container header");
  Header h;
  const std::byte* p = bytes.data();
  h.major = uint16_t(read_le(p + 8, 2));
  h.minor = uint16_t(read_le(p + 10, 2));
  h.header_size = uint32_t(read_le(p + 12, 4));
  // The version is checked before anything else that a later version could have changed.
  check(h.major != 0, where, ": container format version 0.", h.minor, " is not valid");
  check(h.major <= kMajorVersion, where, ": container format version ", h.major, ".", h.minor,
        " is newer than this program reads (", kMajorVersion,
        ".x); update klein, or convert the model again with this version");
  check(h.header_size >= kHeaderSize && h.header_size <= 65536 && h.header_size % 8 == 0, where,
        ": corrupt header: header size ", h.header_size, " (expected ", kHeaderSize,
        " or a larger multiple of 8)");
  check(bytes.size() >= h.header_size, where, ": truncated: ", bytes.size(),
        " bytes, shorter than the container header (", h.header_size, " bytes)");
  const uint64_t stored = read_le(p + h.header_size - 8, 8);
  const uint64_t computed = xxh3(p, h.header_size - 8);
  check(stored == computed, where, ": corrupt header: header checksum mismatch (stored ",
        hex64(stored), ", computed ", hex64(computed), ")");
  h.header_xxh3 = stored;
  for (size_t i = 0; i < std::size(kHeaderWords); ++i)
    h.*kHeaderWords[i] = read_le(p + 16 + 8 * i, 8);
  h.unit_count = uint32_t(read_le(p + kHeaderWordsEnd, 4));
  h.tensor_count = uint32_t(read_le(p + kHeaderWordsEnd + 4, 4));

  const uint64_t unknown = h.flags & kRequiredFlagsMask;
  check(unknown == 0, where, ": the container uses features this program does not know",
        " (required flags 0x", hex64(unknown), "); update klein");
  check(actual_size >= h.file_size, where, ": truncated: the header says ", h.file_size,
        " bytes, the file has ", actual_size);
  check(actual_size == h.file_size, where, ": the file has ", actual_size,
        " bytes, the header says ", h.file_size, " (data appended after the container?)");
  check(is_pow2(h.alignment) && h.alignment >= kMinAlignment && h.alignment <= kMaxAlignment, where,
        ": corrupt header: unit alignment ", h.alignment,
        " (expected a power of two between 64 KiB and 1 GiB)");
  check(h.metadata_raw_size <= kMaxMetadataBytes, where, ": metadata of ", h.metadata_raw_size,
        " bytes is larger than any reader accepts (", kMaxMetadataBytes, ")");
  check(h.index_size <= kMaxIndexBytes, where, ": index of ", h.index_size,
        " bytes is larger than any reader accepts");

  struct Section {
    const char* name;
    uint64_t offset, size;
  };
  const Section sections[] = {{"header", 0, h.header_size},
                              {"metadata", h.metadata_offset, h.metadata_size},
                              {"index", h.index_offset, h.index_size},
                              {"data", h.data_offset, h.data_size}};
  for (const auto& s : sections)
    check(inside(s.offset, s.size, h.file_size), where, ": corrupt header: the ", s.name,
          " section ", range_str(s.offset, s.size), " lies outside the file (", h.file_size,
          " bytes)");
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = i + 1; j < 4; ++j) {
      const auto& a = sections[i];
      const auto& b = sections[j];
      if (a.size == 0 || b.size == 0) continue;
      check(a.offset + a.size <= b.offset || b.offset + b.size <= a.offset, where,
            ": corrupt header: the ", a.name, " section ", range_str(a.offset, a.size),
            " overlaps the ", b.name, " section ", range_str(b.offset, b.size));
    }
  check(h.data_offset % h.alignment == 0, where, ": corrupt header: data offset ", h.data_offset,
        " is not a multiple of the alignment ", h.alignment);
  return h;
}

Index decode_index(const Header& h, std::span<const std::byte> bytes, const std::string& where) {
  check(bytes.size() == h.index_size, where, ": index is ", bytes.size(), " bytes, header says ",
        h.index_size);
  In in(bytes, where);
  Index index;
  // Every record takes at least this many bytes, so the counts cannot exceed the index size
  // (checked before reserving memory for them).
  constexpr uint64_t kMinUnitRecord = 2 + 1 + 4 + 4 + 8 + 8 + 8;
  constexpr uint64_t kMinTensorRecord = 2 + 1 + 4 + 4 + 8 + 8 + 8;
  check(uint64_t(h.unit_count) * kMinUnitRecord + uint64_t(h.tensor_count) * kMinTensorRecord <=
            bytes.size(),
        where, ": corrupt index: ", h.unit_count, " units and ", h.tensor_count,
        " tensors cannot fit in ", bytes.size(), " bytes");
  index.units.resize(h.unit_count);
  index.tensors.resize(h.tensor_count);

  auto read_name = [&](const std::string& what) {
    const uint16_t n = in.u16(what + " name length");
    check(n > 0 && n <= kMaxNameBytes, where, ": corrupt index: ", what, " has a name of ", n,
          " bytes");
    std::string s = in.str(n, what + " name");
    check(valid_name(s), where, ": corrupt index: ", what, " has a name with control characters");
    return s;
  };

  for (uint32_t i = 0; i < h.unit_count; ++i) {
    UnitEntry& u = index.units[i];
    const std::string what = "unit #" + std::to_string(i);
    u.name = read_name(what);
    const std::string named = "unit " + u.name;
    u.first_tensor = in.u32(named);
    u.tensor_count = in.u32(named);
    u.offset = in.u64(named);
    u.size = in.u64(named);
    u.xxh3 = in.u64(named);
  }
  for (uint32_t i = 0; i < h.tensor_count; ++i) {
    TensorEntry& t = index.tensors[i];
    const std::string what = "tensor #" + std::to_string(i);
    t.name = read_name(what);
    const std::string named = "tensor " + t.name;
    const uint8_t code = in.u8(named);
    check(dtype_of_code(code, t.type), where, ": tensor ", t.name, " has storage type code ",
          int(code),
          ", unknown to this program (known: 0..4); corrupt, or written by a newer klein");
    t.layout = in.u8(named);
    const uint8_t ndim = in.u8(named);
    check(ndim <= kMaxDims, where, ": corrupt index: tensor ", t.name, " has ", int(ndim),
          " dimensions");
    in.u8(named);  // reserved
    t.block_size = in.u32(named);
    check(t.block_size > 0, where, ": corrupt index: tensor ", t.name, " has block size 0");
    t.shape.resize(ndim);
    uint64_t numel = 1;
    for (uint8_t d = 0; d < ndim; ++d) {
      const uint64_t v = in.u64(named);
      check(v <= (uint64_t(1) << 40) && (v == 0 || numel <= (uint64_t(1) << 48) / v), where,
            ": corrupt index: tensor ", t.name, " has an impossible dimension ", v);
      numel *= v;
      t.shape[d] = int64_t(v);
    }
    t.offset = in.u64(named);
    t.size = in.u64(named);
    t.xxh3 = in.u64(named);
    if (dtype_is_float(t.type)) {
      check(t.block_size == 1, where, ": corrupt index: tensor ", t.name, " of type ",
            dtype_name(t.type), " has block size ", t.block_size, " (expected 1)");
      check(t.size == numel * dtype_size(t.type), where, ": corrupt index: tensor ", t.name, " ",
            shape_str(t.shape), " of type ", dtype_name(t.type), " should take ",
            numel * dtype_size(t.type), " bytes, the index says ", t.size);
    }
  }
  check(in.remaining() == 0, where, ": corrupt index: ", in.remaining(),
        " bytes left after the last tensor record");

  // Names unique; units partition the tensor table in order; ranges nested and disjoint.
  std::set<std::string> unit_names, tensor_names;
  for (const auto& t : index.tensors)
    check(tensor_names.insert(t.name).second, where, ": corrupt index: tensor ", t.name,
          " appears twice");
  const uint64_t data_end = h.data_offset + h.data_size;
  uint64_t next_tensor = 0;
  uint64_t prev_end = h.data_offset;
  std::vector<size_t> order(index.units.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return index.units[a].offset < index.units[b].offset; });
  for (const auto& u : index.units) {
    check(unit_names.insert(u.name).second, where, ": corrupt index: unit ", u.name,
          " appears twice");
    check(u.first_tensor == next_tensor && u.tensor_count > 0 &&
              uint64_t(u.first_tensor) + u.tensor_count <= index.tensors.size(),
          where, ": corrupt index: unit ", u.name, " claims tensors [", u.first_tensor, ", ",
          uint64_t(u.first_tensor) + u.tensor_count, ") but the next unassigned tensor is ",
          next_tensor, " of ", index.tensors.size());
    next_tensor += u.tensor_count;
    check(inside(u.offset, u.size, h.file_size) && u.offset >= h.data_offset &&
              u.offset + u.size <= data_end,
          where, ": corrupt index: unit ", u.name, " spans bytes ", range_str(u.offset, u.size),
          ", outside the data section ", range_str(h.data_offset, h.data_size), " of the file (",
          h.file_size, " bytes)");
    check(u.offset % h.alignment == 0, where, ": corrupt index: unit ", u.name, " starts at ",
          u.offset, ", not a multiple of the alignment ", h.alignment);
    uint64_t cursor = u.offset;
    for (uint32_t k = 0; k < u.tensor_count; ++k) {
      const TensorEntry& t = index.tensors[u.first_tensor + k];
      check(inside(t.offset, t.size, h.file_size) && t.offset >= cursor &&
                t.offset + t.size <= u.offset + u.size,
            where, ": corrupt index: tensor ", t.name, " spans bytes ", range_str(t.offset, t.size),
            ", outside its unit ", u.name, " ", range_str(u.offset, u.size),
            " or overlapping the tensor before it");
      check(t.offset % kTensorAlignment == 0, where, ": corrupt index: tensor ", t.name,
            " starts at ", t.offset, ", not a multiple of ", kTensorAlignment);
      cursor = t.offset + t.size;
    }
  }
  check(next_tensor == index.tensors.size(), where, ": corrupt index: tensors ", next_tensor,
        " and after belong to no unit");
  for (size_t i = 0; i < order.size(); ++i) {
    const UnitEntry& u = index.units[order[i]];
    check(u.offset >= prev_end, where, ": corrupt index: unit ", u.name, " ",
          range_str(u.offset, u.size), " overlaps the unit before it");
    prev_end = u.offset + u.size;
  }
  return index;
}

}  // namespace klein::container
