#include "cli/memory_options.h"

#include "core/memory.h"

namespace klein::cli {

std::optional<uint64_t> MemoryOptions::budget() const {
  if (max_memory.empty()) return std::nullopt;
  return parse_memory_size(max_memory, "--max-memory");
}

std::optional<Residency> MemoryOptions::forced() const {
  if (residency == "paged") return Residency::Paged;
  if (residency == "resident") return Residency::Resident;
  return std::nullopt;
}

void add_memory_options(CLI::App& cmd, MemoryOptions& o) {
  const char* group = "Memory";
  cmd.add_option("--max-memory", o.max_memory,
                 "memory budget, e.g. 800M, 1.5G, 2GiB (binary units): a run whose estimate "
                 "does not fit is refused before it starts (default: the available memory less "
                 "a margin)")
      ->group(group);
  cmd.add_option("--residency", o.residency,
                 "paged (the default, also \"auto\": one block or layer at a time, the next "
                 "read ahead; a few per cent slower, a fraction of the memory) or resident "
                 "(each network's units stay mapped while it runs)")
      ->check(CLI::IsMember({"auto", "paged", "resident"}))
      ->group(group);
}

}  // namespace klein::cli
