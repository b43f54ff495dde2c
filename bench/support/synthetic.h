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
#include <string>

#include "weights/config.h"

namespace klein {

struct SyntheticModelOptions {
  std::filesystem::path out_dir;        // created; must not exist or be empty
  // vocab.json, merges.txt, tokenizer_config.json, or tokenizer.json (all files are copied)
  std::filesystem::path tokenizer_dir;
  ModelConfig config;                   // defaults: FLUX.2-klein-4B with Qwen3-4B (36 layers)
  uint64_t seed = 0;
};

// The configuration of a published variant, for synthetic models: klein's "4b", "4b-base",
// "4b-kv", "9b", "9b-base", "9b-kv", and "zimage-turbo" (docs/MODELS.md gives the sources of
// every number).
// Throws klein::Error for other names.
ModelConfig klein_variant_config(const std::string& variant);

// Called after each tensor: file being written, bytes written so far, bytes in total.
using SyntheticProgress = std::function<void(const std::string& file, uint64_t done, uint64_t total)>;

void write_synthetic_model(const SyntheticModelOptions& options, const SyntheticProgress& progress = {});

}  // namespace klein
