#pragma once
// How much memory a generation needs, and whether the weights can stay resident.
//
// A generation runs three networks one after the other, each holding its weights only while
// it runs (the pipeline releases a network when it is done):
//   text encoder   the layers that feed the context, the token rows of the embedding table,
//                  activations for the family's prompt length (512 ids)
//   transformer    every block, the shared unit (embedders, modulation) while the embeddings
//                  and all steps' modulation vectors are computed, the planned activations
//                  and the per-generation tensors (each family's, FamilyStages::memory_inputs)
//   VAE            the decoder (the encoder first when there are references) and its
//                  activation bound at the image size (vae::decode_memory)
// Paged, a network needs its two largest units at once (one computing, the next read ahead);
// resident, all of its units. The need of a mode is the largest phase plus the process's
// fixed part (program, tokenizer, libraries). Paged is the default (a few per cent slower,
// a fraction of the memory); resident only when asked (--residency). A budget between the
// largest unit and the two largest turns the read-ahead off: each unit is read when it is
// needed, one at a time (what lets klein-9B at Q8, whose double block is 0.46 GB, run in
// 1 GiB; slower when the weights are not in the page cache). Below what paging one unit at a
// time needs, a budget the user gave is refused.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/vae/blocks.h"
#include "weights/weight_store.h"

namespace klein {

// Bytes of one phase.
struct PhaseNeed {
  std::string phase;                 // "text encoder", "vae encode", "denoise", "vae decode"
  uint64_t weights_paged = 0;        // largest units held at once when paged
  uint64_t weights_resident = 0;     // all of the phase's units
  uint64_t activations = 0;
  uint64_t weights_one_unit = 0;     // paged without read-ahead: the largest unit
  uint64_t scratch = 0;              // disk, not memory: a banded VAE pass's scratch files
  std::string scratch_dir;           // where they go
  uint64_t paged() const { return weights_paged + activations; }
  uint64_t resident() const { return weights_resident + activations; }
  uint64_t one_unit() const { return weights_one_unit + activations; }
};

// The sizes of a network's units: all of them (resident), the two largest (paged with the
// next one read ahead) and the largest (paged one at a time).
struct UnitSizes {
  uint64_t total = 0;
  uint64_t largest = 0, second = 0;
  void add(uint64_t bytes) {
    total += bytes;
    if (bytes > largest) {
      second = largest;
      largest = bytes;
    } else if (bytes > second) {
      second = bytes;
    }
  }
  uint64_t two_largest() const { return largest + second; }
};

struct MemoryPlanInputs;
// A family's denoising phases: the set-up (embeddings, modulation) and the steps.
using DenoiseNeed =
    std::function<std::pair<PhaseNeed, PhaseNeed>(const WeightStore&, const MemoryPlanInputs&)>;

// What the estimate needs to know about the generation.
struct MemoryPlanInputs {
  int64_t width = 0, height = 0;                           // output size in pixels
  std::vector<std::pair<int64_t, int64_t>> references;     // (width, height) of each reference
  int64_t steps = 4;
  bool guided = false;                                     // CFG: a second context
  int64_t batch = 1;                                       // images denoised together
  bool text_encoder = true;                                // false: the context comes from elsewhere
  bool image = true;                                       // false: the text encoder alone
  uint64_t adapter_bytes = 0;                              // LoRA updates, held throughout
  vae::VaeMemory vae_memory;                               // how the VAE encodes and decodes
  // The family's part (FamilyStages::memory_inputs): the ids every prompt becomes, the width
  // of its context rows, and its denoising phases.
  int64_t text_tokens = 0;
  int64_t context_width = 0;
  DenoiseNeed denoise;
};


struct MemoryEstimate {
  uint64_t fixed = 0;  // program, libraries, tokenizer
  std::vector<PhaseNeed> phases;
  uint64_t paged() const;     // fixed + the largest phase, paged
  uint64_t resident() const;  // fixed + the largest phase, resident
  uint64_t one_unit() const;  // fixed + the largest phase, paged without read-ahead
};

MemoryEstimate estimate_memory(const WeightStore& store, const MemoryPlanInputs& inputs);

struct MemoryPlan {
  Residency residency = Residency::Paged;
  bool read_ahead = true;     // paged: the next unit is read while one computes
  uint64_t budget = 0;
  bool budget_given = false;  // --max-memory, else from the available memory
  uint64_t available = 0;     // MemAvailable when planned (0: unknown)
  MemoryEstimate need;
  std::string reason;         // one sentence: why this residency
  nlohmann::ordered_json to_json() const;
};

// The default budget: what the kernel says is available, less a margin for the rest of the
// machine (an eighth, at least 256 MiB). 0 when unknown.
uint64_t default_memory_budget(uint64_t available);

// Picks the residency for `budget` (none: default_memory_budget of the available memory), or
// takes `forced` (--residency), and whether paging reads ahead (only when the budget holds
// it). A given budget below the need of the chosen mode (paged one unit at a time, when
// choosing) throws klein::Error naming both sizes; without one, a machine short of memory
// runs paged anyway, without read-ahead, and the reason says so.
MemoryPlan plan_memory(const MemoryEstimate& need, std::optional<uint64_t> budget,
                       uint64_t available, std::optional<Residency> forced = {});

}  // namespace klein
