#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/files.h"

namespace klein {

namespace {

const char kMagic[] = "\x93NUMPY";

DType parse_descr(const std::string& descr, const std::string& where) {
  if (descr == "<f4") return DType::F32;
  if (descr == "<i8") return DType::I64;
  if (descr == "<i4") return DType::I32;
  if (descr == "|u1") return DType::U8;
  fail(where, ": unsupported .npy dtype '", descr, "' (expected <f4, <i8, <i4 or |u1)");
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::I64: return "<i8";
    case DType::I32: return "<i4";
    default: return nullptr;
  }
}

}  // namespace

NpyArray read_npy(const std::filesystem::path& path) {
  const std::string where = path.string();
  const std::string file = read_text_file(path);
  check(file.size() >= 10 && file.compare(0, 6, kMagic, 6) == 0, where, ": not a .npy file");
  const int major = uint8_t(file[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = uint8_t(file[8]) | (size_t(uint8_t(file[9])) << 8);
    header_start = 10;
  } else {
    check(file.size() >= 12, where, ": truncated .npy header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= size_t(uint8_t(file[8 + i])) << (8 * i);
    header_start = 12;
  }
  check(header_start + header_len <= file.size(), where, ": truncated .npy header");
  const std::string header = file.substr(header_start, header_len);

  std::smatch m;
  check(std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")), where,
        ": .npy header has no descr");
  NpyArray a;
  a.dtype = parse_descr(m[1], where);
  check(std::regex_search(header, m, std::regex("'fortran_order':\\s*(True|False)")), where,
        ": .npy header has no fortran_order");
  check(m[1] == "False", where, ": Fortran-order .npy files are not supported");
  check(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), where,
        ": .npy header has no shape");
  // The shape: comma-separated non-negative integers (a trailing comma for one dimension);
  // anything else, or a size past what the file could hold, is refused before any arithmetic
  // can overflow.
  const std::string dims = m[1];
  const size_t data_start = header_start + header_len;
  const size_t available = file.size() - data_start;
  size_t elements = 1;
  size_t at = 0;
  while (at < dims.size()) {
    while (at < dims.size() && (dims[at] == ' ' || dims[at] == ',')) ++at;
    if (at == dims.size()) break;
    size_t end = at;
    while (end < dims.size() && dims[end] >= '0' && dims[end] <= '9') ++end;
    check(end > at && end - at <= 18, where, ": .npy shape (", dims, ") is not a list of ",
          "non-negative whole numbers");
    const int64_t d = std::stoll(dims.substr(at, end - at));
    check(a.shape.size() < 32, where, ": .npy shape (", dims, ") has too many dimensions");
    check(d == 0 || elements <= available / size_t(d), where, ": .npy shape (", dims,
          ") needs more data than the file holds (", available, " bytes)");
    elements *= size_t(d);
    a.shape.push_back(d);
    at = end;
  }
  const size_t bytes = elements * dtype_size(a.dtype);
  check(available == bytes, where, ": data size ", available, " bytes does not match shape ",
        shape_str(a.shape), " (", bytes, " bytes)");
  a.bytes.resize(bytes);
  if (bytes > 0) std::memcpy(a.bytes.data(), file.data() + data_start, bytes);  // empty: no pointer
  return a;
}

namespace {

// Element i of an array of `dtype` (F32, I32, I64 or U8, the types read_npy accepts) as T.
template <class T>
T element_as(DType dtype, const std::vector<std::byte>& bytes, size_t i) {
  switch (dtype) {
    case DType::U8:
      return T(uint8_t(bytes[i]));
    case DType::I64: {
      int64_t v;
      std::memcpy(&v, bytes.data() + 8 * i, 8);
      return T(v);
    }
    case DType::I32: {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return T(v);
    }
    default: {
      float v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      return T(v);
    }
  }
}

template <class T>
std::vector<T> elements_as(DType dtype, const std::vector<std::byte>& bytes, int64_t n) {
  std::vector<T> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = element_as<T>(dtype, bytes, i);
  return out;
}

}  // namespace

std::vector<float> NpyArray::to_f32() const { return elements_as<float>(dtype, bytes, numel()); }

std::vector<int64_t> NpyArray::to_i64() const {
  return elements_as<int64_t>(dtype, bytes, numel());
}

Tensor NpyArray::to_tensor() const {
  Tensor t(shape);
  auto v = to_f32();
  std::memcpy(t.data(), v.data(), v.size() * 4);
  return t;
}

void write_npy(const std::filesystem::path& path, DType dtype, const Shape& shape,
               const void* data) {
  const char* descr = descr_of(dtype);
  check(descr != nullptr, "internal: cannot write dtype ", dtype_name(dtype), " to .npy");
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + ", ";
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  if (shape.size() == 1) dims.pop_back();
  std::string header = std::string("{'descr': '") + descr +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Pad so that the data starts on a 64-byte boundary; the header ends in '\n'.
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  AtomicFile out(path);
  out.write(kMagic, 6);
  const char version[2] = {1, 0};
  out.write(version, 2);
  const uint16_t len = uint16_t(header.size());
  const char len_bytes[2] = {char(len & 0xff), char(len >> 8)};
  out.write(len_bytes, 2);
  out.write(header);
  out.write(data, size_t(numel(shape)) * dtype_size(dtype));
  out.commit();
}

}  // namespace klein
