#include "core/memory.h"

#include <sys/resource.h>
#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace klein {

namespace {

// The highest mark read before a reset: getrusage may forget what a reset cleared.
std::atomic<uint64_t> g_peak_before_reset{0};

void fold_peak(uint64_t value) {
  uint64_t seen = g_peak_before_reset.load();
  while (value > seen && !g_peak_before_reset.compare_exchange_weak(seen, value)) {
  }
}

}  // namespace

uint64_t peak_rss_bytes() {
  struct rusage u {};
  uint64_t peak = 0;
  if (getrusage(RUSAGE_SELF, &u) == 0) peak = uint64_t(u.ru_maxrss) * 1024;  // Linux: KiB
  return std::max({peak, g_peak_before_reset.load(), peak_rss_since_reset()});
}

uint64_t current_rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? uint64_t(resident) * uint64_t(sysconf(_SC_PAGESIZE)) : 0;
}

// The value of the line "<key>: N kB" of a /proc file, in bytes (0 when absent).
static uint64_t proc_kib_line(const char* path, const char* key) {
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char line[256];
  const size_t key_length = std::strlen(key);
  unsigned long kib = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, key, key_length) == 0 && line[key_length] == ':' &&
        std::sscanf(line + key_length + 1, " %lu kB", &kib) == 1)
      break;
  std::fclose(f);
  return uint64_t(kib) * 1024;
}

uint64_t available_memory_bytes() { return proc_kib_line("/proc/meminfo", "MemAvailable"); }

bool reset_peak_rss() {
  fold_peak(peak_rss_since_reset());
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

uint64_t peak_rss_since_reset() { return proc_kib_line("/proc/self/status", "VmHWM"); }

void return_free_memory() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

void map_large_allocations() {
#if defined(__GLIBC__)
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
}

uint64_t parse_memory_size(std::string_view text, const std::string& what) {
  auto bad = [&](const char* why) -> uint64_t {
    fail(what, " ", std::string(text), ": ", why, "; expected a size such as 800M, 1.5G or "
         "2GiB (units K, M, G, T, binary; a bare number is bytes)");
  };
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const size_t number_begin = i;
  bool digits = false, dot = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return bad(text.empty() ? "empty size" : "not a number");
  const double number = std::strtod(std::string(text.substr(number_begin, i - number_begin)).c_str(),
                                    nullptr);
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::string unit;
  for (; i < text.size(); ++i) unit += char(std::toupper(static_cast<unsigned char>(text[i])));
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.back()))) unit.pop_back();
  int shift = -1;
  const char* units[] = {"", "K", "M", "G", "T"};
  for (int u = 0; u < 5 && shift < 0; ++u)
    for (const char* suffix : {"", "B", "IB"}) {
      if (u == 0 && std::strcmp(suffix, "IB") == 0) continue;
      if (unit == std::string(units[u]) + suffix) {
        shift = 10 * u;
        break;
      }
    }
  if (shift < 0) return bad("unknown unit");
  const double bytes = std::ldexp(number, shift);
  if (!(bytes >= 1)) return bad("the size must be at least one byte");
  if (bytes >= 18446744073709551615.0) return bad("the size is too large");
  return uint64_t(std::llround(bytes));
}

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = double(bytes);
  if (bytes >= (uint64_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(uint64_t(1) << 30));
  } else if (bytes >= (uint64_t(1) << 20)) {
    std::snprintf(buf, sizeof buf, "%.0f MiB", b / double(uint64_t(1) << 20));
  } else if (bytes >= (uint64_t(1) << 10)) {
    std::snprintf(buf, sizeof buf, "%.0f KiB", b / 1024.0);
  } else {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  }
  return buf;
}

std::string format_decimal_bytes(uint64_t bytes, int decimals) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", u == 0 ? 0 : decimals, v, units[u]);
  return buf;
}

}  // namespace klein
