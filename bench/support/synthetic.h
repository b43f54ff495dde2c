#pragma once
// A full-size synthetic checkpoint of a FLUX.2-klein or Z-Image variant: random weights with the exact names, shapes,
// dtypes and file layout of the published diffusers directory (configs included, the text
// encoder in two shards with an index), so that speed and memory can be measured on the real
// shapes without the real weights. Its images are meaningless by design.
//
// Weight scales keep activations finite and non-degenerate through all blocks:
//   Linear [out, in]          uniform with std gain/sqrt(in)   (gain 2 for AdaLN modulation)
//   Conv [out, in, kh, kw]    uniform with std 1/sqrt(in*kh*kw) (0.5 for the decoder's conv_out)
//   attention Q/K norms       1.8 * (1 + 0.1 u)      other 1-D norm weights: 1 + 0.1 u
//   biases                    0.02 u                 token embedding: 0.5 u
//   latent BatchNorm          mean 0.3 u, var exp(0.4 u)
// with u of unit variance (uniform on [-sqrt 3, sqrt 3]); each tensor draws from its own
// generator seeded by (seed, tensor name), so the files do not depend on write order.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/threadpool.h"
#include "weights/config.h"
#include "weights/weight_store.h"

namespace klein {

struct SyntheticModelOptions {
  std::filesystem::path out_dir;        // created; must not exist or be empty
  // vocab.json, merges.txt, tokenizer_config.json, or tokenizer.json (all files are copied)
  std::filesystem::path tokenizer_dir;
  ModelConfig config;                   // defaults: FLUX.2-klein-4B with Qwen3-4B (36 layers)
  uint64_t seed = 0;
};

// The configuration of a published model of a registered family (ModelFamily::published_models:
// klein's "4b", "4b-base", "4b-kv", "9b", "9b-base", "9b-kv", Z-Image's "zimage-turbo",
// FLUX.2-dev's "dev"; docs/MODELS.md gives the sources of every number).
// Throws klein::Error naming the known ones for other names.
ModelConfig klein_variant_config(const std::string& variant);

// Called after each tensor: file being written, bytes written so far, bytes in total.
using SyntheticProgress = std::function<void(const std::string& file, uint64_t done, uint64_t total)>;

void write_synthetic_model(const SyntheticModelOptions& options, const SyntheticProgress& progress = {});

// The same random weights made in memory a unit at a time, never written as BF16 files:
// `klein synth -t TYPE` converts this store straight into a container, for models whose
// BF16 files would not fit on the disk (FLUX.2-dev: about 100 GB). It holds the tensors
// inference reads (the text encoder up to its last output layer), under their canonical
// names. Values follow the rules above; each tensor is drawn in pieces of 2^20 values, each
// from its own generator seeded by (seed, name, piece), on `threads` threads, so they do
// not depend on the thread count (they differ from the files' values).
class SyntheticStore final : public WeightStore {
 public:
  SyntheticStore(ModelConfig config, uint64_t seed, int threads);
  ~SyntheticStore() override;
  UnitRef acquire(const std::string& unit) override;
  UnitRef describe(const std::string& unit) override;  // shapes only, no values made
  bool has_unit(const std::string& unit) const override { return units_.count(unit) > 0; }
  std::vector<std::string> units() const override;
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override;
  uint64_t unit_bytes(const std::string& unit) const override;

 private:
  struct Planned {
    std::string prefix;
    std::vector<std::pair<std::string, Shape>> tensors;  // canonical name, shape
  };
  ModelConfig config_;
  uint64_t seed_;
  std::unique_ptr<ThreadPool> pool_;
  std::map<std::string, Planned> units_;
  UnitRef make(const std::string& unit, bool values);
};

}  // namespace klein
