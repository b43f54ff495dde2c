#pragma once
// Choosing tokens from a language model's logits, and the generation loop over LanguageModel:
// greedy (argmax, ties to the lowest id) or sampled with temperature, top-k and top-p, with
// the rules of transformers' generate() (the warpers in that order, each only when set), and
// our own reproducible draw: a uniform u from std::mt19937_64 (the standard fixes its output)
// picks the first token whose cumulative probability, most probable first, exceeds u.
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/qwen3/language_model.h"

namespace klein::qwen3 {

struct SamplingOptions {
  bool sample = false;      // false: greedy
  float temperature = 1.0f; // applied when != 1
  int top_k = 0;            // applied when > 0
  float top_p = 1.0f;       // applied when < 1
};

struct Candidate {
  int32_t id;
  float prob;
};

// argmax of the logits, the lowest id among equal maxima.
int32_t argmax(std::span<const float> logits);

// The tokens a sampled draw can pick, with their probabilities (softmax of the processed
// scores, float32), most probable first, ties by the lower id.
std::vector<Candidate> sampling_support(std::span<const float> logits, const SamplingOptions& o);

// The token for a uniform u in [0, 1): the first candidate whose running sum (float64, in the
// support's order) exceeds u times the total.
int32_t draw(const std::vector<Candidate>& support, double u);

class TokenPicker {
 public:
  TokenPicker(const SamplingOptions& o, uint64_t seed) : o_(o), rng_(seed) {}
  int32_t pick(std::span<const float> logits);

 private:
  SamplingOptions o_;
  std::mt19937_64 rng_;
};

struct GenerationResult {
  std::vector<int32_t> ids;  // the new tokens, the stop token included when one ended it
  bool stopped = false;      // a stop token ended it (else max_new_tokens did)
  double prefill_seconds = 0, decode_seconds = 0;
};

// Runs the prompt, then picks and feeds tokens until one of `stop` is picked or
// max_new_tokens are made. on_token (may be empty) sees each new id as it is chosen.
GenerationResult generate(LanguageModel& lm, std::span<const int32_t> prompt,
                          int max_new_tokens, TokenPicker& picker,
                          std::span<const int32_t> stop,
                          const std::function<void(int32_t)>& on_token = {});

}  // namespace klein::qwen3
