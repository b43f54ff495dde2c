#pragma once
// The safetensors format: 8-byte little-endian header length N, N bytes of UTF-8 JSON
// mapping tensor name -> {dtype, shape, data_offsets [begin, end)} (offsets relative to the
// data area that follows the header), optional "__metadata__", then raw little-endian data.
// Files are mapped read-only; tensors are views into the mapping.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/tensor.h"

namespace klein {

struct SafetensorsEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // absolute offset in the file
  uint64_t end = 0;
};

// The header length N of a safetensors file of `file_size` bytes whose first 8 bytes are
// `first8` (given only when at least 8 exist), checked against the file size and a 100 MiB
// limit; errors name `where`. The header is bytes [8, 8 + N).
uint64_t safetensors_header_length(const std::byte* first8, uint64_t file_size,
                                   const std::string& where);

// One .safetensors file, validated completely when opened: header length against the file
// size, well-formed JSON, known dtypes, shape x dtype size equal to the offset span, spans
// inside the data area and not overlapping, unique names.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  TensorView view(const SafetensorsEntry& e) const;
  const MappedFile& mapping() const { return file_; }

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A checkpoint of one or more files: a single .safetensors, or the shards listed by a
// "*.safetensors.index.json" (weight_map: tensor name -> shard file name).
class SafetensorsSet {
 public:
  // `path` is a .safetensors file or an .index.json file.
  explicit SafetensorsSet(const std::filesystem::path& path);

  struct Located {
    const SafetensorsFile* file;
    const SafetensorsEntry* entry;
  };
  // All tensors of all shards, in file order.
  const std::vector<Located>& tensors() const { return tensors_; }
  const Located* find(const std::string& name) const;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  // The path the set was opened from: the .safetensors file or the .index.json.
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<Located> tensors_;
  std::map<std::string, size_t> index_;
};

}  // namespace klein
