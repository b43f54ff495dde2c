#pragma once
// The report's numbers as text, spelt one way in its tables, its HTML page and the policy
// search's log.
#include <cstdint>
#include <cstdio>
#include <string>

#include "convert/policy.h"

namespace klein::report {

// 3.142e-01
inline std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3e", v);
  return buf;
}

// "12.35 MB" (decimal megabytes)
inline std::string mb(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", double(bytes) / 1e6);
  return buf;
}

// "bf16", "q8", ...
inline std::string type_name(DType t) { return convert::storage_type_name(t); }

}  // namespace klein::report
