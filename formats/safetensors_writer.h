#pragma once
// Writes a .safetensors file by streaming: the header (with every tensor's offsets) is laid
// out from the declared shapes first, then tensors are written one at a time in declaration
// order, so writing a multi-GB file needs memory for one tensor only. Written to a
// temporary name and renamed by finish(); an unfinished writer leaves nothing behind.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/tensor.h"

namespace klein {

struct SafetensorsDecl {
  std::string name;
  DType dtype;  // F32, F16, BF16, I64, I32, U8
  Shape shape;
  size_t nbytes() const;
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<SafetensorsDecl> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  // The next tensor's bytes (exactly its declared size), in declaration order; may be
  // called several times per tensor with consecutive pieces.
  void write(const void* data, size_t n);
  void finish();

  const std::vector<SafetensorsDecl>& tensors() const { return tensors_; }

 private:
  AtomicFile out_;
  std::vector<SafetensorsDecl> tensors_;
  uint64_t data_start_ = 0;
  uint64_t total_data_ = 0;
};

}  // namespace klein
