#pragma once
// Memory facts of this process and machine, and memory sizes as the user writes them.
#include <cstdint>
#include <string>
#include <string_view>

namespace klein {

// Peak resident set size of this process so far, in bytes (getrusage, and the marks seen
// before each reset_peak_rss()).
uint64_t peak_rss_bytes();
// Current resident set size in bytes (/proc/self/statm), 0 if unknown.
uint64_t current_rss_bytes();
// Memory the kernel says is available for new allocations without swapping
// (/proc/meminfo MemAvailable), 0 if unknown.
uint64_t available_memory_bytes();

// Per-phase peaks: reset_peak_rss() sets the kernel's high-water mark of this process to its
// current RSS (/proc/self/clear_refs, Linux >= 4.0) and returns false when it cannot;
// peak_rss_since_reset() reads the mark (VmHWM), 0 if unknown. peak_rss_bytes() still covers
// the whole process.
bool reset_peak_rss();
uint64_t peak_rss_since_reset();

// Gives memory the allocator holds but no longer uses back to the system (glibc keeps freed
// blocks below its adaptive mmap threshold in its heaps): called between networks, so that
// what one network freed does not stay in the RSS of the next. A no-op elsewhere.
void return_free_memory();

// From now on every allocation of 1 MiB or more gets a mapping of its own, returned to the
// system when it is freed (glibc's M_MMAP_THRESHOLD, fixed instead of growing to 32 MiB).
// Activations of a few MiB then cannot be kept in heap holes between longer-lived blocks:
// a 512x512 run peaked at 719 MiB without it, 589 MiB with it (docs/SPEED.md). For programs
// (the CLI calls it first thing); a library leaves the process's allocator alone.
void map_large_allocations();

// A size as a user writes it: a number (decimals allowed) and an optional unit K, M, G or T,
// optionally followed by B or iB, case-insensitive; all units are binary (1G = 1 GiB, as
// for `sort -S` or docker). A bare number is bytes. "800M", "1.5G", "2GiB", "512mb".
// Throws klein::Error naming `what` (e.g. "--max-memory") and the accepted forms.
uint64_t parse_memory_size(std::string_view text, const std::string& what);
// Bytes for people: "812 MiB", "1.50 GiB", "640 KiB", "12 B".
std::string format_bytes(uint64_t bytes);
// In decimal units, as file and checkpoint sizes are usually quoted: "7.75 GB", "512 B".
std::string format_decimal_bytes(uint64_t bytes, int decimals = 2);

// The bytes of n floats.
inline uint64_t f32_bytes(int64_t n) { return uint64_t(n) * sizeof(float); }

}  // namespace klein
