#include "formats/container/writer.h"

#include <zstd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace klein::container {

namespace {

const std::byte kZeros[4096] = {};

}  // namespace

ContainerWriter::ContainerWriter(const std::filesystem::path& path, uint64_t alignment)
    : out_(path) {
  check(alignment >= kMinAlignment && alignment <= kMaxAlignment && !(alignment & (alignment - 1)),
        "container alignment ", alignment, " must be a power of two between 64 KiB and 1 GiB");
  header_.alignment = alignment;
  // The header is written last, over these zeros.
  out_.write(kZeros, kHeaderSize);
}

ContainerWriter::~ContainerWriter() = default;

void ContainerWriter::pad_to(uint64_t multiple) {
  uint64_t gap = (multiple - out_.offset() % multiple) % multiple;
  while (gap > 0) {
    const size_t n = size_t(std::min<uint64_t>(gap, sizeof kZeros));
    out_.write(kZeros, n);
    if (in_unit_) unit_hash_.update(kZeros, n);
    gap -= n;
  }
}

void ContainerWriter::write_metadata(std::string_view json, int zstd_level) {
  check(!metadata_written_ && !in_unit_,
        "internal: container metadata written twice or inside "
        "a unit");
  std::vector<char> packed(ZSTD_compressBound(json.size()));
  const size_t n =
      ZSTD_compress(packed.data(), packed.size(), json.data(), json.size(), zstd_level);
  check(!ZSTD_isError(n), "compressing the container metadata: ", ZSTD_getErrorName(n));
  header_.metadata_offset = out_.offset();
  header_.metadata_size = n;
  header_.metadata_raw_size = json.size();
  header_.metadata_xxh3 = xxh3(packed.data(), n);
  out_.write(packed.data(), n);
  metadata_written_ = true;
  metadata_after_units_ = !index_.units.empty();
}

void ContainerWriter::begin_unit(const std::string& name) {
  check(!metadata_after_units_, "internal: container unit ", name, " after the metadata");
  check(!in_unit_, "internal: unit ", name, " begun inside another unit");
  pad_to(header_.alignment);
  if (index_.units.empty()) header_.data_offset = out_.offset();
  UnitEntry u;
  u.name = name;
  u.first_tensor = uint32_t(index_.tensors.size());
  u.offset = out_.offset();
  index_.units.push_back(std::move(u));
  unit_hash_.reset();
  in_unit_ = true;
}

void ContainerWriter::begin_tensor(TensorEntry t) {
  check(in_unit_ && !in_tensor_, "internal: tensor ", t.name, " begun outside a unit");
  pad_to(kTensorAlignment);
  t.offset = out_.offset();
  t.xxh3 = 0;
  index_.tensors.push_back(std::move(t));
  ++index_.units.back().tensor_count;
  tensor_hash_.reset();
  tensor_written_ = 0;
  in_tensor_ = true;
}

void ContainerWriter::write(const void* data, size_t n) {
  TensorEntry& t = index_.tensors.back();
  check(in_tensor_ && tensor_written_ + n <= t.size, "internal: tensor ", t.name, " given ",
        tensor_written_ + n, " bytes, declared ", t.size);
  out_.write(data, n);
  unit_hash_.update(data, n);
  tensor_hash_.update(data, n);
  tensor_written_ += n;
}

void ContainerWriter::end_tensor() {
  TensorEntry& t = index_.tensors.back();
  check(in_tensor_ && tensor_written_ == t.size, "internal: tensor ", t.name, " got ",
        tensor_written_, " bytes, declared ", t.size);
  t.xxh3 = tensor_hash_.digest();
  in_tensor_ = false;
}

void ContainerWriter::end_unit() {
  check(in_unit_ && !in_tensor_, "internal: end of a unit outside a unit");
  UnitEntry& u = index_.units.back();
  check(u.tensor_count > 0, "internal: unit ", u.name, " has no tensors");
  u.size = out_.offset() - u.offset;
  u.xxh3 = unit_hash_.digest();
  in_unit_ = false;
}

void ContainerWriter::commit() {
  check(metadata_written_ && !in_unit_, "internal: container committed incomplete");
  check(!index_.units.empty(), "internal: container without units");
  const UnitEntry& last = index_.units.back();
  header_.data_size = last.offset + last.size - header_.data_offset;
  const std::vector<std::byte> index = encode_index(index_);
  header_.index_offset = out_.offset();
  header_.index_size = index.size();
  header_.index_xxh3 = xxh3(index.data(), index.size());
  header_.unit_count = uint32_t(index_.units.size());
  header_.tensor_count = uint32_t(index_.tensors.size());
  out_.write(index.data(), index.size());
  header_.file_size = out_.offset();
  const auto head = encode_header(header_);
  std::FILE* f = out_.stream();
  const std::string temp = out_.temp_path().string();
  if (std::fflush(f) != 0 || std::fseek(f, 0, SEEK_SET) != 0 ||
      std::fwrite(head.data(), 1, head.size(), f) != head.size() || std::fseek(f, 0, SEEK_END) != 0)
    fail("cannot write ", temp, ": ", std::strerror(errno));
  out_.commit();
}

}  // namespace klein::container
