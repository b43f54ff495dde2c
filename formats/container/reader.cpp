#include "formats/container/reader.h"

#include <sys/mman.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <fstream>

#include "core/error.h"
#include "formats/xxh3.h"

namespace klein::container {

namespace fs = std::filesystem;

bool is_container(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  std::array<char, kMagic.size()> buf{};
  if (!in.read(buf.data(), buf.size())) return false;
  return has_magic(std::as_bytes(std::span(buf)));
}

std::string read_metadata_text(std::span<const std::byte> file, const Header& h,
                               const std::string& where) {
  const std::byte* p = file.data() + h.metadata_offset;
  const uint64_t sum = xxh3(p, h.metadata_size);
  check(sum == h.metadata_xxh3, where, ": corrupt metadata: checksum mismatch (stored ",
        hex64(h.metadata_xxh3), ", computed ", hex64(sum), ")");
  const unsigned long long framed = ZSTD_getFrameContentSize(p, h.metadata_size);
  check(framed == h.metadata_raw_size, where, ": corrupt metadata: the zstd frame holds ",
        framed == ZSTD_CONTENTSIZE_UNKNOWN || framed == ZSTD_CONTENTSIZE_ERROR
            ? std::string("an unknown number of")
            : std::to_string(framed),
        " bytes, the header says ", h.metadata_raw_size);
  std::string text(h.metadata_raw_size, '\0');
  const size_t n = ZSTD_decompress(text.data(), text.size(), p, h.metadata_size);
  check(!ZSTD_isError(n), where, ": corrupt metadata: zstd: ", ZSTD_getErrorName(n));
  check(n == text.size(), where, ": corrupt metadata: decompressed to ", n, " bytes, expected ",
        text.size());
  return text;
}

ContainerFile::ContainerFile(const fs::path& path) : file_(path) {
  const std::string where = path.string();
  const std::span<const std::byte> all(file_.data(), file_.size());
  header_ = decode_header(all, file_.size(), where);
  const std::span<const std::byte> index_bytes =
      all.subspan(header_.index_offset, header_.index_size);
  const uint64_t sum = xxh3(index_bytes.data(), index_bytes.size());
  check(sum == header_.index_xxh3, where, ": corrupt index: checksum mismatch (stored ",
        hex64(header_.index_xxh3), ", computed ", hex64(sum), ")");
  index_ = decode_index(header_, index_bytes, where);
  metadata_ = nlohmann::json::parse(read_metadata_text(all, header_, where), nullptr, false);
  check(!metadata_.is_discarded() && metadata_.is_object(), where,
        ": corrupt metadata: not a JSON object");
  for (size_t i = 0; i < index_.units.size(); ++i) units_by_name_[index_.units[i].name] = i;
}

const UnitEntry* ContainerFile::find_unit(const std::string& name) const {
  auto it = units_by_name_.find(name);
  return it == units_by_name_.end() ? nullptr : &index_.units[it->second];
}

uint64_t ContainerFile::unit_checksum(const UnitEntry& u, bool drop_pages) const {
  if (!drop_pages) return xxh3(at(u.offset), u.size);
  // Units start on the container's alignment (>= 64 KiB, a multiple of the page size), so
  // slices of a power-of-two size >= 64 KiB start on pages too.
  constexpr uint64_t kSlice = uint64_t(4) << 20;
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  xxh3::Hasher hasher;
  for (uint64_t done = 0; done < u.size; done += kSlice) {
    const size_t n = size_t(std::min(kSlice, u.size - done));
    hasher.update(at(u.offset + done), n);
    ::madvise(const_cast<std::byte*>(at(u.offset + done)), (n + page - 1) / page * page,
              MADV_DONTNEED);
  }
  const uint64_t sum = hasher.digest();
  return sum;
}

void ContainerFile::check_unit(const UnitEntry& u, bool drop_pages) const {
  const uint64_t sum = unit_checksum(u, drop_pages);
  // The message is built only on failure: this runs at every page-in, inside the steps.
  if (sum != u.xxh3)
    fail(path().string(), ": unit ", u.name,
         " is corrupt: checksum mismatch over bytes [", u.offset, ", ", u.offset + u.size,
         ") (stored ", hex64(u.xxh3), ", computed ", hex64(sum),
         "); convert the model again or restore the file");
}

VerifyReport verify_container(const ContainerFile& file,
                              const std::function<void(size_t, size_t)>& progress) {
  VerifyReport r;
  const Header& h = file.header();
  const Index& index = file.index();
  // One pass over each unit: the unit's and its tensors' checksums are fed the same slices
  // while they are in the cache; then the unit's pages are dropped, so that checking a file
  // larger than memory keeps the process small.
  constexpr uint64_t kSlice = uint64_t(1) << 20;
  xxh3::Hasher unit_hash, tensor_hash;
  for (size_t i = 0; i < index.units.size(); ++i) {
    const UnitEntry& u = index.units[i];
    unit_hash.reset();
    std::vector<VerifyProblem> bad_tensors;  // listed after the unit
    uint64_t cursor = u.offset;
    for (const TensorEntry& t : file.tensors_of(u)) {
      unit_hash.update(file.at(cursor), t.offset - cursor);  // padding
      tensor_hash.reset();
      for (uint64_t at = t.offset; at < t.offset + t.size; at += kSlice) {
        const size_t n = size_t(std::min(kSlice, t.offset + t.size - at));
        tensor_hash.update(file.at(at), n);
        unit_hash.update(file.at(at), n);
      }
      cursor = t.offset + t.size;
      const uint64_t ts = tensor_hash.digest();
      if (ts != t.xxh3)
        bad_tensors.push_back({"tensor", t.name,
                               "checksum mismatch (stored " + hex64(t.xxh3) + ", computed " +
                                   hex64(ts) + ") in unit " + u.name});
      ++r.tensors_checked;
    }
    unit_hash.update(file.at(cursor), u.offset + u.size - cursor);
    const uint64_t sum = unit_hash.digest();
    if (sum != u.xxh3)
      r.problems.push_back(
          {"unit", u.name,
           "checksum mismatch (stored " + hex64(u.xxh3) + ", computed " + hex64(sum) + ")"});
    r.problems.insert(r.problems.end(), bad_tensors.begin(), bad_tensors.end());
    const size_t page = size_t(::sysconf(_SC_PAGESIZE));
    ::madvise(const_cast<std::byte*>(file.at(u.offset)), (u.size + page - 1) / page * page,
              MADV_DONTNEED);
    ++r.units_checked;
    r.bytes_checked += u.size;
    if (progress) progress(i + 1, index.units.size());
  }
  // Every byte not in a section or a tensor is padding and must be zero.
  std::vector<std::pair<uint64_t, uint64_t>> used = {
      {0, h.header_size}, {h.metadata_offset, h.metadata_size}, {h.index_offset, h.index_size}};
  for (const auto& t : index.tensors) used.push_back({t.offset, t.size});
  std::sort(used.begin(), used.end());
  uint64_t cursor = 0;
  auto check_gap = [&](uint64_t begin, uint64_t end) {
    for (uint64_t p = begin; p < end; ++p)
      if (*file.at(p) != std::byte{0}) {
        std::string near = "between sections";
        for (const auto& u : index.units)
          if (p >= u.offset && p < u.offset + u.size) near = "inside unit " + u.name;
        r.problems.push_back(
            {"padding", near,
             "non-zero byte at offset " + std::to_string(p) + " (padding must be zero)"});
        return;
      }
  };
  for (const auto& [offset, size] : used) {
    if (offset > cursor) check_gap(cursor, offset);
    cursor = std::max(cursor, offset + size);
  }
  check_gap(cursor, h.file_size);
  return r;
}

}  // namespace klein::container
