#pragma once
// PyTorch's .pth files as torch.save writes them since 1.6: a zip archive whose entries all
// sit in one top folder (named after the file when it was saved, e.g. taef2_decoder/):
//
//   <top>/data.pkl          the pickled state dict (formats/torch_pickle.h: read without
//                           executing anything; anything but tensors is refused)
//   <top>/data/<key>        each storage's raw little-endian bytes
//   <top>/byteorder         "little" (absent in files of older versions: little)
//   <top>/version, .format_version, .storage_alignment, .data/serialization_id   (ignored)
//
// Entries must be stored (torch.save never compresses); sizes and offsets come from the central
// directory (torch.save writes data descriptors, so the local headers carry zeros), with the
// ZIP64 end record and size fields read where present. The archive is mapped read-only and
// every tensor is a view into the mapping, like SafetensorsFile's. Checksums are not verified.
// Bounds: at most 1,000,000 entries, names of at most 4096 bytes, every range inside the file;
// a file cut short is an error naming it.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/tensor.h"

namespace klein {

struct PthEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // absolute offset in the file
  uint64_t end = 0;
};

class PthFile {
 public:
  explicit PthFile(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return file_.path(); }
  // The state dict's tensors in its order.
  const std::vector<PthEntry>& entries() const { return entries_; }
  const PthEntry* find(const std::string& name) const;
  TensorView view(const PthEntry& e) const;

 private:
  MappedFile file_;
  std::vector<PthEntry> entries_;
  std::map<std::string, size_t> index_;
};

// Whether the file starts like a zip archive (a .pth of torch.save) rather than a
// safetensors file.
bool looks_like_zip(const std::filesystem::path& path);

}  // namespace klein
