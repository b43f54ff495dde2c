#pragma once
// Reading a klein container: the file is mapped read-only; opening checks the header, the
// index (checksum and structure) and the metadata (checksum, decompression, JSON). Tensor
// data is not read until asked for: units are spans of the mapping, checked against their
// checksums by whoever pages them in (check_unit), and by verify_container.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "core/files.h"
#include "formats/container/format.h"

namespace klein::container {

// True when `path` is a regular file that starts with the container magic.
bool is_container(const std::filesystem::path& path);

class ContainerFile {
 public:
  explicit ContainerFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  const Header& header() const { return header_; }
  const Index& index() const { return index_; }
  const nlohmann::json& metadata() const { return metadata_; }

  const UnitEntry* find_unit(const std::string& name) const;
  std::span<const TensorEntry> tensors_of(const UnitEntry& u) const {
    return {index_.tensors.data() + u.first_tensor, u.tensor_count};
  }
  // The bytes of a range already checked to lie inside the file (units, tensors).
  const std::byte* at(uint64_t offset) const { return file_.data() + offset; }
  const MappedFile& mapping() const { return file_; }

  // XXH3-64 of a unit's bytes (reads them: this is what pages a unit in from disk). With
  // drop_pages, each slice's pages are dropped from the process once hashed (they stay in
  // the page cache while memory allows), so checking a unit does not make it resident.
  uint64_t unit_checksum(const UnitEntry& u, bool drop_pages = false) const;
  // Throws klein::Error naming the file and the unit when its bytes do not match the index.
  void check_unit(const UnitEntry& u, bool drop_pages = false) const;

 private:
  MappedFile file_;
  Header header_;
  Index index_;
  nlohmann::json metadata_;
  std::map<std::string, size_t> units_by_name_;
};

// Decompresses and checks the metadata section of a container given as bytes (the whole
// file); used by ContainerFile and by tools that read the metadata alone.
std::string read_metadata_text(std::span<const std::byte> file, const Header& h,
                               const std::string& where);

// The outcome of checking every byte of a container.
struct VerifyProblem {
  std::string region;  // "unit", "tensor", "padding"
  std::string name;    // unit or tensor name
  std::string message;
};
struct VerifyReport {
  size_t units_checked = 0;
  size_t tensors_checked = 0;
  uint64_t bytes_checked = 0;
  std::vector<VerifyProblem> problems;
  bool ok() const { return problems.empty(); }
};

// Checks every unit and every tensor against its checksum, and that the padding between
// tensors and units is zero. The header, index and metadata were checked when `file` was
// opened. `progress(done, total)` is called after each unit if given.
VerifyReport verify_container(const ContainerFile& file,
                              const std::function<void(size_t, size_t)>& progress = {});

}  // namespace klein::container
