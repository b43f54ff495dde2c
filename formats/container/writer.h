#pragma once
// Writing a klein container, streaming: each unit's tensors as their bytes are produced
// (never the whole model in memory), the metadata before the first unit or after the last
// one, then the index; the header is filled in last. The file is written under a temporary
// name and renamed onto the target by commit(); destroying the writer without commit()
// removes the temporary file.
//
//   ContainerWriter w(path);
//   w.begin_unit("transformer.double.0");
//   w.begin_tensor({.name = ..., .type = DType::BF16, .shape = {256, 256}, .size = 131072});
//   w.write(bytes, n); ...                  // exactly `size` bytes in total
//   w.end_tensor();
//   w.end_unit();
//   ...
//   w.write_metadata(json_text);
//   w.commit();
#include <cstdint>
#include <filesystem>
#include <string_view>

#include "core/files.h"
#include "formats/container/format.h"
#include "formats/xxh3.h"


namespace klein::container {

class ContainerWriter {
 public:
  // `alignment`: where units start, a power of two >= 64 KiB.
  explicit ContainerWriter(const std::filesystem::path& path, uint64_t alignment = kMinAlignment);
  ~ContainerWriter();
  ContainerWriter(const ContainerWriter&) = delete;
  ContainerWriter& operator=(const ContainerWriter&) = delete;

  const std::filesystem::path& temp_path() const { return out_.temp_path(); }

  // Once, before the first unit or after the last one (not between units). `json` is the
  // UTF-8 metadata text; it is stored zstd-compressed.
  void write_metadata(std::string_view json, int zstd_level = 12);

  void begin_unit(const std::string& name);
  // `t` gives name, type, layout, block_size, shape and size; offset and checksum are the
  // writer's. The tensor's `size` bytes follow through write().
  void begin_tensor(TensorEntry t);
  void write(const void* data, size_t n);
  void end_tensor();
  void end_unit();

  uint64_t bytes_written() const { return out_.offset(); }
  // Writes the index and the header, flushes and renames the file into place.
  void commit();

 private:
  void pad_to(uint64_t multiple);

  AtomicFile out_;
  Header header_;
  Index index_;
  bool metadata_written_ = false;
  bool metadata_after_units_ = false;
  bool in_unit_ = false;
  bool in_tensor_ = false;
  uint64_t tensor_written_ = 0;
  xxh3::Hasher unit_hash_, tensor_hash_;
};

}  // namespace klein::container
