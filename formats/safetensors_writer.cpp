#include "formats/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace klein {

size_t SafetensorsDecl::nbytes() const { return size_t(numel(shape)) * dtype_size(dtype); }

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     std::vector<SafetensorsDecl> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : out_(path), tensors_(std::move(tensors)) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    check(dtype_size(t.dtype) > 0, "safetensors cannot store ", dtype_name(t.dtype), " (tensor ",
          t.name, ")");
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  total_data_ = offset;
  std::string text = header.dump();
  // Pad with spaces so the data area starts 8-byte aligned, as the reference writer does.
  while ((8 + text.size()) % 8) text += ' ';
  const uint64_t len = text.size();
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out_.write(len_bytes, 8);
  out_.write(text);
  data_start_ = out_.offset();
}

void SafetensorsWriter::write(const void* data, size_t n) {
  check(out_.offset() - data_start_ + n <= total_data_, "internal: more tensor data written to ",
        out_.temp_path().string(), " than declared");
  out_.write(data, n);
}

void SafetensorsWriter::finish() {
  check(out_.offset() - data_start_ == total_data_, "internal: ", out_.temp_path().string(),
        " received ", out_.offset() - data_start_, " of ", total_data_, " declared data bytes");
  out_.commit();
}

}  // namespace klein
