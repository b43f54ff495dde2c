#include "formats/st_files.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/safetensors.h"
#include "support/testing.h"

namespace klein::testing {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

void write_bytes(const fs::path& path, const std::string& head,
                 const std::vector<std::byte>& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << "cannot write " << path;
  out.write(head.data(), std::streamsize(head.size()));
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

std::string length_prefix(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

void write_safetensors(const fs::path& path, const std::vector<StTensor>& tensors) {
  json header = json::object();
  std::vector<std::byte> data;
  for (const auto& t : tensors) {
    const uint64_t begin = data.size();
    data.insert(data.end(), t.bytes.begin(), t.bytes.end());
    header[t.name] = {
        {"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  // The reference writer pads the header with spaces to a multiple of 8 bytes.
  text.append((8 - text.size() % 8) % 8, ' ');
  write_bytes(path, length_prefix(text.size()) + text, data);
}

void write_raw_safetensors(const fs::path& path, const std::string& header, size_t data_bytes,
                           std::optional<uint64_t> declared_length) {
  write_bytes(path, length_prefix(declared_length.value_or(header.size())) + header,
              std::vector<std::byte>(data_bytes, std::byte{0x5a}));
}

std::vector<StTensor> read_all(const fs::path& path) {
  SafetensorsSet set(path);
  std::vector<StTensor> out;
  for (const auto& t : set.tensors()) {
    const TensorView v = t.file->view(*t.entry);
    const auto* p = static_cast<const std::byte*>(v.data);
    out.push_back({t.entry->name, std::string(dtype_name(t.entry->dtype)), t.entry->shape,
                   std::vector<std::byte>(p, p + v.nbytes)});
  }
  return out;
}

std::vector<std::byte> pattern_bytes(size_t bytes, uint32_t seed) {
  std::vector<std::byte> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = std::byte(x & 0xff);
  }
  return out;
}

TinyModelCopy::TinyModelCopy(const std::string& name) : dir_(temp_dir(name)) {
  const fs::path from = tiny_model();
  for (const auto& e : fs::recursive_directory_iterator(from)) {
    const fs::path target = dir_ / fs::relative(e.path(), from);
    if (e.is_directory())
      fs::create_directories(target);
    else
      fs::create_symlink(e.path(), target);
  }
}

TinyModelCopy::~TinyModelCopy() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

void TinyModelCopy::remove(const std::string& relative) { fs::remove(dir_ / relative); }

void TinyModelCopy::write(const std::string& relative, const std::string& text) {
  remove(relative);
  write_text(dir_ / relative, text);
}

void TinyModelCopy::write_safetensors(const std::string& relative,
                                      const std::vector<StTensor>& tensors) {
  remove(relative);
  testing::write_safetensors(dir_ / relative, tensors);
}

}  // namespace klein::testing
