#pragma once
// The prompt-upsampling options shared by `klein upsample` (plain names) and `klein generate`
// (the same with an "upsample-" prefix): the system message file, the token limit and the
// sampling settings. Any sampling setting turns sampling on (greedy otherwise), with Qwen3's
// recommended values for the ones not given (temperature 0.6, top-k 20, top-p 0.95).
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "pipeline/upsample.h"

namespace klein::cli {

struct UpsampleArgs {
  std::string system_file;
  int max_tokens = 512;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  bool edit = false;

  // Checked and read (the system file), ready for upsample_prompt.
  UpsampleOptions options(const std::string& prefix) const;
};

void add_upsample_options(CLI::App& cmd, UpsampleArgs& a, const std::string& prefix);

}  // namespace klein::cli
