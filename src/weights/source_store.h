#pragma once
// A WeightStore that reads straight from the published safetensors files: tensors are views
// into the mapped files (zero copy), except the few that a layout change forces us to
// rebuild (BFL's swapped final-layer halves). Nothing is converted to float ahead of use
// (the linear layers convert BF16 per panel). Residency as for containers (weight_store.h):
// paged (the default) drops a unit's pages from the process when its last reference goes
// and prefetch() asks the kernel to read the next unit ahead; tensors of the published files
// do not start on pages, so a page shared with a neighbouring unit's tensor is dropped too
// and faulted in again from the page cache when that tensor is read.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "weights/naming.h"
#include "weights/residency_tracker.h"
#include "weights/weight_store.h"

namespace klein {

struct SourceComponent {
  Component component;
  Layout layout = Layout::Diffusers;
  std::filesystem::path config_file;  // its config.json; empty when read from tensor shapes
  std::unique_ptr<SafetensorsSet> files;  // the safetensors file(s), or
  std::unique_ptr<gguf::File> gguf;       // a GGUF file (weights/gguf_source.h)
  std::vector<TensorSource> tensors;  // canonical name -> where its bytes are

  // The source tensor `name` (TensorSource::source) as stored: dtype, shape, bytes, layout;
  // nullopt when the files have no such tensor.
  std::optional<Weight> stored(const std::string& name) const;
  // The mapped files, and the path the component was opened from (file or .index.json).
  std::vector<const MappedFile*> mapped() const;
  std::filesystem::path path() const;
  // fp8 weights' scale tensors (source names; weights/fp8.h). An fp8 weight is decoded to
  // float32 when its unit is acquired (value = code x scale); the companions of fp8 weights
  // (scales, input scales, markers) are not in `tensors`.
  std::map<std::string, std::string> fp8_scales;
};

class SourceStore final : public WeightStore {
 public:
  SourceStore(std::vector<SourceComponent> components, ModelConfig config, std::string identity);
  ~SourceStore() override;

  UnitRef acquire(const std::string& unit) override;
  void prefetch(const std::string& unit) override;
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return identity_; }

  const std::vector<SourceComponent>& components() const { return components_; }

  // GGUF block tensors (Q8_0 and the other GGML types) decoded to float32 when their unit is
  // acquired: the exact values a quantized GGUF stands for, at float32 memory per unit (klein
  // report's reference). Off: they are handed out as stored, for convert.
  void set_decode_blocks(bool on) { decode_blocks_ = on; }
  // FP8 weights decoded to float32 when their unit is acquired (on, the default: what the
  // kernels and report read). Off: handed out as stored with their scale (Weight::scale), so
  // that convert decodes a slice at a time instead of holding a unit in float32.
  void set_decode_fp8(bool on) { decode_fp8_ = on; }

  void set_residency(Residency r) override;
  Residency residency() const override;
  uint64_t unit_bytes(const std::string& unit) const override;
  void release(const std::string& prefix) override;
  StoreOrigin origin() const override;

 private:
  struct Pending {
    const SourceComponent* component;
    const TensorSource* source;
  };
  class Unit;
  // The mapped bytes of a unit's tensors.
  std::vector<std::pair<const std::byte*, size_t>> ranges_of(const std::string& unit) const;
  void advise(const std::string& unit, int advice) const;
  void unit_gone(const std::string& name);
  std::vector<UnitRef> take_kept_locked(const std::string& prefix);
  std::vector<SourceComponent> components_;
  ModelConfig config_;
  std::string identity_;
  std::map<std::string, std::vector<Pending>> units_;  // unit -> its tensors
  std::map<std::string, std::string> prefixes_;        // unit -> name prefix
  std::map<std::string, uint64_t> bytes_;              // unit -> bytes of its tensors as stored
  std::map<std::string, uint64_t> fp8_decoded_extra_;  // unit -> more when fp8 is decoded
  std::map<std::string, std::weak_ptr<const WeightUnit>> live_;
  std::map<std::string, UnitRef> kept_;  // resident: units stay until release()
  Residency residency_ = Residency::Paged;
  bool decode_blocks_ = false;
  bool decode_fp8_ = true;
};

}  // namespace klein
