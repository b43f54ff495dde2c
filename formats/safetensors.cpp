#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Largest header we accept: real checkpoints have headers of a few hundred KiB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

DType parse_dtype(const std::string& s, const std::string& tensor, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I64") return DType::I64;
  if (s == "I32") return DType::I32;
  if (s == "U8") return DType::U8;
  if (s == "F8_E4M3") return DType::F8_E4M3;
  if (s == "F8_E5M2") return DType::F8_E5M2;
  fail(where, ": unsupported dtype ", s, " in tensor ", tensor,
       " (supported: F32, F16, BF16, F8_E4M3, F8_E5M2; I64/I32/U8 for buffers)");
}

uint64_t read_u64_le(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

uint64_t safetensors_header_length(const std::byte* first8, uint64_t file_size,
                                   const std::string& where) {
  check(file_size >= 8, where, ": file of ", file_size,
        " bytes is too small to be a safetensors file");
  const uint64_t header_len = read_u64_le(first8);
  check(header_len <= kMaxHeaderBytes && header_len <= file_size - 8, where, ": header length ",
        header_len, " does not fit in a file of ", file_size,
        " bytes (truncated or not safetensors)");
  return header_len;
}

SafetensorsFile::SafetensorsFile(const fs::path& path) : file_(path) {
  const std::string where = path.string();
  const uint64_t size = file_.size();
  const uint64_t header_len = safetensors_header_length(file_.data(), size, where);
  const char* header_begin = reinterpret_cast<const char*>(file_.data() + 8);
  // Names must be unique; a JSON object keeps only one value per key, so catch repeats
  // while parsing.
  std::set<std::string> seen;
  std::string duplicate;
  json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && duplicate.empty()) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = key;
    }
    return true;
  };
  json header = json::parse(header_begin, header_begin + header_len, note_keys, false);
  check(!header.is_discarded(), where, ": header is not valid JSON");
  check(duplicate.empty(), where, ": tensor name ", duplicate, " appears twice in the header");
  check(header.is_object(), where, ": header is not a JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      check(value.is_object(), where, ": __metadata__ is not an object");
      for (auto& [k, v] : value.items())
        if (v.is_string()) metadata_[k] = v.get<std::string>();
      continue;
    }
    check(value.is_object() && value.contains("dtype") && value.contains("shape") &&
              value.contains("data_offsets"),
          where, ": tensor ", name, " lacks dtype, shape or data_offsets");
    check(value["dtype"].is_string(), where, ": tensor ", name, ": dtype is not a string");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = parse_dtype(value["dtype"].get<std::string>(), name, where);
    const json& shape = value["shape"];
    check(shape.is_array(), where, ": tensor ", name, ": shape is not an array");
    uint64_t count = 1;
    for (const json& d : shape) {
      check(d.is_number_unsigned(), where, ": tensor ", name, ": shape entries must be non-negative integers");
      const uint64_t dim = d.get<uint64_t>();
      check(dim < (1ull << 40) && (dim == 0 || count <= (1ull << 50) / dim), where, ": tensor ",
            name, ": shape is absurdly large");
      count *= dim;
      e.shape.push_back(int64_t(dim));
    }
    const json& off = value["data_offsets"];
    check(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
              off[1].is_number_unsigned(),
          where, ": tensor ", name, ": data_offsets must be two non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    check(b <= en, where, ": tensor ", name, ": data_offsets [", b, ", ", en,
          ") end before they begin");
    check(en <= data_size, where, ": tensor ", name, ": data_offsets [", b, ", ", en,
          ") lie outside the data area of ", data_size, " bytes (file truncated?)");
    const uint64_t expected = count * dtype_size(e.dtype);
    check(en - b == expected, where, ": tensor ", name, ": shape ", shape_str(e.shape), " x ",
          dtype_name(e.dtype), " needs ", expected, " bytes but data_offsets span ", en - b);
    e.begin = data_start + b;
    e.end = data_start + en;
    entries_.push_back(std::move(e));
  }
  std::sort(entries_.begin(), entries_.end(),
            [](const auto& a, const auto& b) { return a.begin < b.begin; });
  // Compare each tensor with the furthest-reaching one before it, not just its neighbour:
  // an empty tensor sorted in between must not hide an overlap.
  const SafetensorsEntry* reach = nullptr;
  for (const auto& e : entries_) {
    if (e.begin == e.end) continue;  // empty tensors occupy no bytes
    check(reach == nullptr || e.begin >= reach->end, where, ": tensors ", reach ? reach->name : "",
          " and ", e.name, " overlap in the data area");
    if (reach == nullptr || e.end > reach->end) reach = &e;
  }
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

TensorView SafetensorsFile::view(const SafetensorsEntry& e) const {
  TensorView v;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = file_.data() + e.begin;
  v.nbytes = e.end - e.begin;
  return v;
}

SafetensorsSet::SafetensorsSet(const fs::path& path) : path_(path) {
  const std::string where = path.string();
  if (path.filename().string().ends_with(".index.json")) {
    json index = json::parse(read_text_file(path), nullptr, false);
    check(!index.is_discarded() && index.is_object(), where, ": not valid JSON");
    check(index.contains("weight_map") && index["weight_map"].is_object(), where,
          ": no weight_map object");
    std::map<std::string, std::string> wanted;  // tensor -> shard
    std::set<std::string> shards;
    for (auto& [name, shard] : index["weight_map"].items()) {
      check(shard.is_string(), where, ": weight_map entry ", name, " is not a file name");
      wanted[name] = shard.get<std::string>();
      shards.insert(shard.get<std::string>());
    }
    std::map<std::string, const SafetensorsFile*> opened;
    for (const auto& shard : shards) {
      check(shard.find('/') == std::string::npos && shard != ".." && !shard.empty(), where,
            ": shard name '", shard, "' must be a plain file name");
      const fs::path shard_path = path.parent_path() / shard;
      check(fs::exists(shard_path), where, ": shard ", shard, " is missing (expected at ",
            shard_path.string(), ")");
      files_.push_back(std::make_unique<SafetensorsFile>(shard_path));
      opened[shard] = files_.back().get();
    }
    for (const auto& [name, shard] : wanted) {
      const SafetensorsFile* f = opened[shard];
      const SafetensorsEntry* e = f->find(name);
      check(e != nullptr, where, ": tensor ", name, " is listed in shard ", shard,
            " but that file does not contain it");
    }
    for (const auto& f : files_)
      for (const auto& e : f->entries()) {
        auto it = wanted.find(e.name);
        // Tensors a shard holds but the index does not list are still usable.
        check(it == wanted.end() || it->second == f->path().filename().string(), where,
              ": tensor ", e.name, " appears in shard ", f->path().filename().string(),
              " but the index places it in ", it == wanted.end() ? "" : it->second);
      }
  } else {
    files_.push_back(std::make_unique<SafetensorsFile>(path));
  }
  for (const auto& f : files_)
    for (const auto& e : f->entries()) {
      check(!index_.count(e.name), where, ": tensor ", e.name, " appears in more than one shard");
      index_[e.name] = tensors_.size();
      tensors_.push_back({f.get(), &e});
    }
}

const SafetensorsSet::Located* SafetensorsSet::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace klein
