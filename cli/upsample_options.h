#pragma once
// The prompt-upsampling options shared by `klein upsample` (plain names) and `klein generate`
// (the same with an "upsample-" prefix): the system message file, the token limit and the
// sampling settings. Any sampling setting turns sampling on (a temperature of 0: greedy), with
// the family's values for the ones not given (Qwen3's recommended temperature 0.6, top-k 20,
// top-p 0.95; FLUX.2-dev's pipeline's 0.15, top-k 50); none given, the family's default
// (greedy for Qwen3, FLUX.2-dev's pipeline samples: pipeline/upsample.h).
// Both also take a remote model instead of the local one (--upsample-endpoint, hub/chat.h):
// the same system message and token limit, the sampling temperature when one is given, and
// the user's prompt as it was when the service fails (unless --upsample-strict).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "cli/memory_options.h"
#include "hub/chat.h"
#include "pipeline/upsample.h"

namespace klein::cli {

struct UpsampleArgs {
  std::string system_file;
  int max_tokens = 512;
  std::optional<float> temperature, top_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  bool edit = false;
  // The remote model (--upsample-endpoint URL, --upsample-model NAME, the key from the
  // environment variable --upsample-key-env names, --upsample-timeout S, --upsample-strict).
  std::string endpoint, remote_model;
  std::optional<std::string> key_env;  // none: OPENAI_API_KEY when it is set
  double timeout = 60;
  bool strict = false;

  // Checked and read (the system file), ready for upsample_prompt.
  UpsampleOptions options(const std::string& prefix) const;
  // The remote endpoint when one is given, checked (the URL, the key's variable) before any
  // work; none for the local model.
  std::optional<hub::ChatEndpoint> remote(const UpsampleOptions& o) const;
};

// The rewrite by the remote model: `o`'s system message (or ours) over `prompt`, with the
// reference images for an edit.
hub::RemoteUpsample upsample_remotely(const hub::ChatEndpoint& endpoint, const UpsampleArgs& a,
                                      const UpsampleOptions& o, const std::string& prompt,
                                      const std::vector<std::filesystem::path>& images = {});

void add_upsample_options(CLI::App& cmd, UpsampleArgs& a, const std::string& prefix);

// The model of a command that runs the text encoder alone as a language model (klein upsample,
// klein check-prompt): opened as open_upsample_model does, refused with `unavailable`'s
// sentence when it cannot, its residency planned within the memory options.
Model open_language_model(const ModelPaths& paths, const MemoryOptions& memory,
                          std::string (*unavailable)(const Model&));

}  // namespace klein::cli
