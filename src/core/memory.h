#pragma once
// Memory facts of this process and machine.
#include <cstdint>

namespace klein {

// Peak resident set size of this process so far, in bytes (getrusage).
uint64_t peak_rss_bytes();
// Current resident set size in bytes (/proc/self/statm), 0 if unknown.
uint64_t current_rss_bytes();
// Memory the kernel says is available for new allocations without swapping
// (/proc/meminfo MemAvailable), 0 if unknown.
uint64_t available_memory_bytes();

}  // namespace klein
