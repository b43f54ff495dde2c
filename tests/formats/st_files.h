#pragma once
// Test helpers that write safetensors files (well-formed or deliberately broken), copy the
// tiny model for alteration, and capture the message of an expected klein::Error.
#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace klein::testing {

struct StTensor {
  std::string name;
  std::string dtype;  // as spelled in the header: "BF16", "F32", "F8_E4M3", ...
  Shape shape;
  std::vector<std::byte> bytes;
};

// A well-formed file: the tensors' data back to back, in the given order.
void write_safetensors(const std::filesystem::path& path, const std::vector<StTensor>& tensors);

// Any bytes: the 8-byte header length (the header's own size unless `declared_length` says
// otherwise), the header text, then `data_bytes` bytes of data.
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header,
                           size_t data_bytes, std::optional<uint64_t> declared_length = {});

// Every tensor of a safetensors file (or sharded set), with its bytes, in file order.
std::vector<StTensor> read_all(const std::filesystem::path& path);

// `bytes` deterministic pseudo-random bytes (distinct per seed) so that copies are checked
// against something other than zeros.
std::vector<std::byte> pattern_bytes(size_t bytes, uint32_t seed);

// A copy of the tiny model in a fresh temporary directory: every file is a symbolic link to
// the read-only original until replaced through write()/write_safetensors()/remove(), which
// first unlink it, so nothing ever writes through to the shared test data.
class TinyModelCopy {
 public:
  explicit TinyModelCopy(const std::string& name);
  ~TinyModelCopy();
  TinyModelCopy(const TinyModelCopy&) = delete;
  TinyModelCopy& operator=(const TinyModelCopy&) = delete;

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path operator/(const std::string& relative) const { return dir_ / relative; }
  void write(const std::string& relative, const std::string& text);
  void write_safetensors(const std::string& relative, const std::vector<StTensor>& tensors);
  void remove(const std::string& relative);

 private:
  std::filesystem::path dir_;
};

}  // namespace klein::testing
