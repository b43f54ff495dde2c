#include "formats/pth.h"

#include <algorithm>
#include <fstream>
#include <span>

#include "core/error.h"
#include "formats/torch_pickle.h"

namespace klein {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kMaxEntries = 1000000;
constexpr uint64_t kMaxNameBytes = 4096;
constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndRecord = 0x06054b50;
constexpr uint32_t kZip64EndRecord = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;

// Little-endian reads at checked offsets of the mapped archive.
class Bytes {
 public:
  Bytes(const std::byte* data, uint64_t size, const std::string& where)
      : data_(data), size_(size), where_(where) {}
  uint64_t size() const { return size_; }
  void need(uint64_t at, uint64_t n, const char* what) const {
    check(at <= size_ && n <= size_ - at, where_, ": ", what, " at byte ", at,
          " runs past the end of the file (", size_, " bytes; truncated?)");
  }
  uint64_t le(uint64_t at, int n, const char* what) const {
    need(at, uint64_t(n), what);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(data_[at + i])) << (8 * i);
    return v;
  }
  uint32_t u32(uint64_t at, const char* what) const { return uint32_t(le(at, 4, what)); }
  uint16_t u16(uint64_t at, const char* what) const { return uint16_t(le(at, 2, what)); }
  uint64_t u64(uint64_t at, const char* what) const { return le(at, 8, what); }
  std::string text(uint64_t at, uint64_t n, const char* what) const {
    need(at, n, what);
    return std::string(reinterpret_cast<const char*>(data_ + at), size_t(n));
  }
  const std::byte* at(uint64_t offset) const { return data_ + offset; }

 private:
  const std::byte* data_;
  uint64_t size_;
  const std::string& where_;
};

struct ZipEntry {
  std::string name;
  uint64_t begin = 0;  // the stored bytes
  uint64_t size = 0;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;  // of the central directory
  uint64_t size = 0;
};

// The end of central directory record (and ZIP64's, where a field is saturated).
Directory find_directory(const Bytes& b, const std::string& where) {
  check(b.size() >= 22, where, ": file of ", b.size(),
        " bytes is too small to be a zip archive (a .pth of torch.save; truncated?)");
  // The record is the last 22 bytes plus a comment of up to 65535 bytes.
  const uint64_t lowest = b.size() >= 22 + 65535 ? b.size() - 22 - 65535 : 0;
  uint64_t end = b.size() - 22;
  while (b.u32(end, "end record") != kEndRecord) {
    check(end > lowest, where,
          ": no zip end of central directory record (not a .pth zip, or "
          "truncated)");
    --end;
  }
  Directory d;
  d.entries = b.u16(end + 10, "end record");
  d.size = b.u32(end + 12, "end record");
  d.offset = b.u32(end + 16, "end record");
  check(b.u16(end + 4, "end record") == 0 && b.u16(end + 6, "end record") == 0, where,
        ": a zip archive split over several disks");
  if (d.entries == 0xffff || d.size == 0xffffffff || d.offset == 0xffffffff) {
    check(end >= 20 && b.u32(end - 20, "ZIP64 locator") == kZip64Locator, where,
          ": the zip end record's fields are saturated but there is no ZIP64 locator before it");
    const uint64_t record = b.u64(end - 20 + 8, "ZIP64 locator");
    check(b.u32(record, "ZIP64 end record") == kZip64EndRecord, where,
          ": the ZIP64 locator points to byte ", record, ", which is not a ZIP64 end record");
    d.entries = b.u64(record + 32, "ZIP64 end record");
    d.size = b.u64(record + 40, "ZIP64 end record");
    d.offset = b.u64(record + 48, "ZIP64 end record");
  }
  check(d.entries <= kMaxEntries, where, ": zip archive lists ", d.entries,
        " entries, more than the ", kMaxEntries, " accepted");
  b.need(d.offset, d.size, "central directory");
  return d;
}

// Every entry of the central directory, its data located through its local header.
std::vector<ZipEntry> read_entries(const Bytes& b, const std::string& where) {
  const Directory d = find_directory(b, where);
  std::vector<ZipEntry> out;
  uint64_t at = d.offset;
  const uint64_t directory_end = d.offset + d.size;
  for (uint64_t i = 0; i < d.entries; ++i) {
    check(at + 46 <= directory_end && b.u32(at, "central directory") == kCentralHeader, where,
          ": central directory entry ", i, " at byte ", at, " is damaged");
    const uint16_t flags = b.u16(at + 8, "central directory");
    const uint16_t method = b.u16(at + 10, "central directory");
    uint64_t compressed = b.u32(at + 20, "central directory");
    uint64_t size = b.u32(at + 24, "central directory");
    const uint64_t name_len = b.u16(at + 28, "central directory");
    const uint64_t extra_len = b.u16(at + 30, "central directory");
    const uint64_t comment_len = b.u16(at + 32, "central directory");
    uint64_t local = b.u32(at + 42, "central directory");
    check(name_len <= kMaxNameBytes, where, ": zip entry name of ", name_len, " bytes");
    check(at + 46 + name_len + extra_len + comment_len <= directory_end, where,
          ": central directory entry ", i, " runs past the directory");
    ZipEntry e;
    e.name = b.text(at + 46, name_len, "entry name");
    // ZIP64 extra field: the saturated fields, in this order, as 64-bit values.
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint16_t id = b.u16(x, "extra field"), len = b.u16(x + 2, "extra field");
      check(x + 4 + len <= at + 46 + name_len + extra_len, where, ": zip entry ", e.name,
            ": an extra field runs past its entry");
      if (id == 0x0001) {
        uint64_t y = x + 4;
        auto take = [&](uint64_t& field) {
          if (field != 0xffffffff) return;
          check(y + 8 <= x + 4 + len, where, ": zip entry ", e.name, ": short ZIP64 field");
          field = b.u64(y, "ZIP64 field");
          y += 8;
        };
        take(size);
        take(compressed);
        take(local);
      }
      x += 4 + len;
    }
    check((flags & 1) == 0, where, ": zip entry ", e.name, " is encrypted");
    check(method == 0, where, ": zip entry ", e.name, " is compressed (method ", method,
          "); torch.save stores its entries uncompressed, and only those are read");
    check(compressed == size, where, ": zip entry ", e.name, " is stored with ", compressed,
          " bytes for ", size);
    check(b.u32(local, "local header") == kLocalHeader, where, ": zip entry ", e.name,
          ": no local header at byte ", local, " (damaged or truncated)");
    const uint64_t local_name = b.u16(local + 26, "local header");
    const uint64_t local_extra = b.u16(local + 28, "local header");
    check(b.text(local + 30, local_name, "local header") == e.name, where, ": zip entry ", e.name,
          ": its local header names another file");
    e.begin = local + 30 + local_name + local_extra;
    e.size = size;
    b.need(e.begin, e.size, ("the data of " + e.name).c_str());
    out.push_back(std::move(e));
    at += 46 + name_len + extra_len + comment_len;
  }
  return out;
}

}  // namespace

PthFile::PthFile(const fs::path& path) : file_(path) {
  const std::string where = path.string();
  const Bytes b(file_.data(), file_.size(), where);
  const std::vector<ZipEntry> zip = read_entries(b, where);

  // The one top folder: the folder of data.pkl.
  const ZipEntry* pickle = nullptr;
  for (const ZipEntry& e : zip) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || e.name.substr(slash) != "/data.pkl") continue;
    check(pickle == nullptr, where, ": two data.pkl entries (", pickle ? pickle->name : "", " and ",
          e.name, ")");
    pickle = &e;
  }
  check(pickle != nullptr, where,
        ": no <folder>/data.pkl entry: not a .pth file of torch.save "
        "(the legacy non-zip format is not read)");
  const std::string top =
      pickle->name.substr(0, pickle->name.size() - std::string("data.pkl").size());
  std::map<std::string, const ZipEntry*> storages;
  for (const ZipEntry& e : zip) {
    if (e.name == top + "byteorder") {
      const std::string order(reinterpret_cast<const char*>(b.at(e.begin)), size_t(e.size));
      check(order == "little", where, ": byteorder is '", order.substr(0, 16),
            "'; only little-endian files are read");
    } else if (e.name.starts_with(top + "data/")) {
      check(storages.emplace(e.name.substr(top.size() + 5), &e).second, where, ": storage entry ",
            e.name, " appears twice");
    }
  }

  const std::vector<TorchTensorRecord> records =
      read_torch_state_dict_pickle(std::span(b.at(pickle->begin), size_t(pickle->size)), where);
  for (const TorchTensorRecord& r : records) {
    auto it = storages.find(r.storage);
    check(it != storages.end(), where, ": tensor ", r.name, " refers to storage ", r.storage,
          ", which has no entry ", top, "data/", r.storage);
    const ZipEntry& s = *it->second;
    const uint64_t element = dtype_size(r.dtype);
    check(s.size == r.storage_numel * element, where, ": storage ", r.storage, " of tensor ",
          r.name, " holds ", s.size, " bytes, but ", r.storage_numel, " ", dtype_name(r.dtype),
          " elements need ", r.storage_numel * element);
    PthEntry e;
    e.name = r.name;
    e.dtype = r.dtype;
    e.shape = r.shape;
    e.begin = s.begin + r.offset * element;
    e.end = e.begin + uint64_t(numel(r.shape)) * element;
    index_[e.name] = entries_.size();
    entries_.push_back(std::move(e));
  }
}

const PthEntry* PthFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView PthFile::view(const PthEntry& e) const {
  TensorView v;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = file_.data() + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

bool looks_like_zip(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && magic[0] == 'P' && magic[1] == 'K' && magic[2] == 3 && magic[3] == 4;
}

}  // namespace klein
