#pragma once
// The one weight interface every model uses. A model asks the store for a unit
// ("transformer.double.3", "text_encoder.layer.12", "vae.decoder") and gets typed views of
// its tensors, valid while it holds the returned reference. The same models run on the
// container (any precision, paged) and straight on the original safetensors (exact).
//
// Units and the names inside them (names are relative to the unit's prefix):
//   transformer.shared        prefix "transformer."   x_embedder.weight, context_embedder.weight,
//                             time_guidance_embed.*, *_modulation*, norm_out.*, proj_out.weight
//   transformer.double.{i}    prefix "transformer.transformer_blocks.{i}."
//   transformer.single.{i}    prefix "transformer.single_transformer_blocks.{i}."
//   text_encoder.embed        prefix "text_encoder.model."   embed_tokens.weight
//   text_encoder.layer.{L}    prefix "text_encoder.model.layers.{L}."
//   text_encoder.norm         prefix "text_encoder.model."   norm.weight (never used)
//   vae.encoder               prefix "vae."   encoder.*, quant_conv.*
//   vae.decoder               prefix "vae."   decoder.*, post_quant_conv.*
//   vae.latent_stats          prefix "vae."   bn.running_mean, bn.running_var
// Canonical (global) names are prefix + relative name, with diffusers / transformers
// spelling: "transformer.transformer_blocks.3.attn.to_q.weight".
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "weights/config.h"

namespace klein {

// One weight tensor. Shapes are PyTorch's: Linear [out, in], Conv2d [out, in, kh, kw].
struct Weight {
  std::string name;       // canonical name
  DType dtype = DType::F32;
  Shape shape;
  const void* data = nullptr;
  size_t nbytes = 0;
  uint8_t layout = 0;     // quant::Layout of the bytes (0 = plain row-major)

  int64_t rows() const { return shape.empty() ? 1 : shape[0]; }
  int64_t cols() const { return shape.empty() ? 1 : klein::numel(shape) / shape[0]; }
  int64_t numel() const { return klein::numel(shape); }
};

class WeightUnit {
 public:
  virtual ~WeightUnit() = default;

  const std::string& name() const { return name_; }
  const std::string& prefix() const { return prefix_; }
  // The tensor `relative` (prefix() + relative is its canonical name). Throws klein::Error
  // naming the unit and tensor when it is missing.
  const Weight& get(std::string_view relative) const;
  const Weight* find(std::string_view relative) const;
  const std::vector<Weight>& weights() const { return weights_; }

 protected:
  WeightUnit(std::string name, std::string prefix) : name_(std::move(name)), prefix_(std::move(prefix)) {}
  void add(Weight w) { weights_.push_back(std::move(w)); }

 private:
  std::string name_;
  std::string prefix_;
  std::vector<Weight> weights_;
};

using UnitRef = std::shared_ptr<const WeightUnit>;

// What a store does with a unit's pages once nobody holds the unit.
//   Paged     drops them from the process (madvise DONTNEED; they stay in the page cache
//             while memory allows) and reads the next unit ahead while one computes: memory
//             follows the units in use, about two at a time.
//   Resident  keeps every unit it has paged in until release() says a network is done:
//             fastest when the machine has the memory.
enum class Residency { Paged, Resident };
const char* residency_name(Residency r);  // "paged", "resident"

// What the store did with a unit, for tests and memory reports.
enum class UnitEvent {
  Prefetch,  // reading ahead started; the unit counts as resident from here
  Acquire,   // a reference was handed out (also when it was resident already)
  Drop,      // its pages were dropped; no longer resident
};
using UnitObserver = std::function<void(const std::string& unit, UnitEvent event)>;

// Units a store has made resident and not dropped (held, read ahead, or kept by a resident
// store), now and at their peak since the store opened or reset_peak() was called.
struct ResidencyStats {
  size_t units = 0;
  uint64_t bytes = 0;
  size_t peak_units = 0;
  uint64_t peak_bytes = 0;
};

class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // Makes the unit resident (reading/checking it if needed) and returns it; the views stay
  // valid while the reference is held.
  virtual UnitRef acquire(const std::string& unit) = 0;
  // Starts bringing a unit in on a background thread, if the store pages; otherwise no-op.
  virtual void prefetch(const std::string& unit) {}
  virtual bool has_unit(const std::string& unit) const = 0;
  virtual std::vector<std::string> units() const = 0;
  virtual const ModelConfig& config() const = 0;
  // A string that changes whenever the weights could have changed (checksum, or file
  // names + sizes + modification times); used to key caches.
  virtual std::string identity() const = 0;
  // True when some tensor under `prefix` ("transformer.") is stored as Q8 or Q4, i.e. the
  // component's output is already an approximation. Answered from the index, without paging.
  virtual bool has_quantized(const std::string& prefix) const { return false; }

  // Residency (see Residency). Stores that do not page keep everything and ignore it.
  virtual void set_residency(Residency r) {}
  virtual Residency residency() const { return Residency::Resident; }
  // Bytes of the unit's tensors as stored: what holding it fully paged in costs.
  virtual uint64_t unit_bytes(const std::string& unit) const { return 0; }
  // This generation will not use the units whose names start with `prefix` again (a network
  // is done): a resident store drops them now; a paged store dropped them already.
  virtual void release(const std::string& prefix) {}
  // Sees every prefetch, acquire and drop, in order (called under the store's lock, possibly
  // from another thread: it must not call the store); empty to stop.
  virtual void set_observer(UnitObserver observer) {}
  virtual ResidencyStats residency_stats() const { return {}; }
  virtual void reset_peak() {}
};

// The values of a small float tensor (norm weights, biases, statistics) as float32.
std::vector<float> weight_to_floats(const Weight& w);

// Unit names.
std::string double_block_unit(int64_t i);
std::string single_block_unit(int64_t i);
std::string text_layer_unit(int64_t layer);

}  // namespace klein
