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
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <utility>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "weights/config.h"
#include "weights/residency_tracker.h"

namespace klein {

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

// What a store was made from, for the tools that convert or describe it (so that no caller
// needs to know the store's class).
struct StoreOrigin {
  std::vector<std::filesystem::path> files;  // every file the weights are read from
  // The mapped bytes of those files (a source checkpoint), so converters can drop pages.
  std::vector<std::pair<const std::byte*, size_t>> mappings;
  // Tensors of the checkpoint that no unit uses (e.g. the text encoder's unused head).
  std::vector<std::string> unused_tensors;
  // The type a tensor has in the checkpoint where its views show another (canonical name ->
  // type): fp8 weights, which a source store hands out as float32.
  std::map<std::string, DType> stored_types;
  const nlohmann::json* container_metadata = nullptr;  // a klein container's metadata
  // Why the weights must be converted before a network can run on them (a GGUF file of
  // quantized GGML types), with the command; empty when they can run as they are.
  std::string needs_conversion;
};

class WeightStore {
 public:
  virtual ~WeightStore() = default;
  // Makes the unit resident (reading/checking it if needed) and returns it; the views stay
  // valid while the reference is held.
  virtual UnitRef acquire(const std::string& unit) = 0;
  // The unit's tensors' names, types and shapes, for planning (convert); their data may be
  // missing (null) where making it would cost (a synthetic store). Default: acquire().
  virtual UnitRef describe(const std::string& unit) { return acquire(unit); }
  // Starts bringing a unit in on a background thread, if the store pages and reads ahead;
  // otherwise no-op.
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
  // Whether prefetch() reads ahead (on by default). Off when the memory budget holds one unit
  // but not two (pipeline/memory_plan.h): units are then read only when acquired.
  void set_read_ahead(bool on);
  bool read_ahead() const;
  // Bytes of the unit's tensors as stored: what holding it fully paged in costs.
  virtual uint64_t unit_bytes(const std::string& unit) const { return 0; }
  // This generation will not use the units whose names start with `prefix` again (a network
  // is done): a resident store drops them now; a paged store dropped them already.
  virtual void release(const std::string& prefix) {}
  // What the store was made from (files, mappings, unused tensors, container metadata).
  virtual StoreOrigin origin() const { return {}; }

  // Sees every prefetch, acquire and drop, in order (called under the store's lock, possibly
  // from another thread: it must not call the store); empty to stop.
  void set_observer(UnitObserver observer);
  // Units resident now and at their peak (a store that does not page reports none).
  ResidencyStats residency_stats() const;
  void reset_peak();

 protected:
  // Adds the time from `started` (taken before acquire() takes the lock: waiting for it
  // counts) to its own end to ResidencyStats::acquire_seconds. Declared after the lock in
  // acquire(), so that it ends under the lock on every way out.
  struct AcquireTime {
    ResidencyTracker& tracker;
    std::chrono::steady_clock::time_point started;
    ~AcquireTime() {
      tracker.acquire_took(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
  };

  // The book-keeping of the stores that page, under their lock.
  mutable std::mutex mutex_;
  ResidencyTracker tracker_;
  bool read_ahead_ = true;  // under mutex_
};

// The values of a small float tensor (norm weights, biases, statistics) as float32.
std::vector<float> weight_to_floats(const Weight& w);

// Unit names.
std::string double_block_unit(int64_t i);
std::string single_block_unit(int64_t i);
std::string text_layer_unit(int64_t layer);

}  // namespace klein
