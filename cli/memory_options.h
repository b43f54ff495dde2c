#pragma once
// The memory options of the subcommands that run a network, spelled and checked the same way
// everywhere:
//   --max-memory SIZE                 the memory budget (800M, 1.5G, 2GiB; binary units);
//                                     default: the available memory less a margin
//   --residency auto|paged|resident   keep the weights resident or page them (auto: decided
//                                     by the budget)
#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "weights/weight_store.h"

namespace klein::cli {

struct MemoryOptions {
  std::string max_memory;  // as typed; empty: none
  std::string residency = "auto";
  std::optional<uint64_t> budget() const;       // throws klein::Error on a bad size
  std::optional<Residency> forced() const;      // none for auto
};

void add_memory_options(CLI::App& cmd, MemoryOptions& options);

}  // namespace klein::cli
