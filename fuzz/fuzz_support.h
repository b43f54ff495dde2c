#pragma once
// Shared by the libFuzzer targets of this directory (scripts/fuzz-parsers.sh builds and runs
// them): parsers that read files get the input through one temporary file per process.
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace klein::fuzz {

// The input bytes as a file (rewritten on every call), named with `suffix`. Its directory is
// removed when the process exits normally (the scripts also point TMPDIR into the build tree,
// for a run that ends in a crash).
inline std::filesystem::path as_file(const uint8_t* data, size_t size, const std::string& suffix) {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("klein-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(
          std::filesystem::temp_directory_path() / ("klein-fuzz-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  const std::filesystem::path p = dir / ("input" + suffix);
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), std::streamsize(size));
  return p;
}

// The input split at the first occurrences of a separator byte into up to `n` parts (for
// parsers of several files at once).
template <size_t n>
std::array<std::string_view, n> split(const uint8_t* data, size_t size, char separator = '\x01') {
  std::array<std::string_view, n> parts{};
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (size_t i = 0; i < n; ++i) {
    const size_t at = i + 1 < n ? rest.find(separator) : std::string_view::npos;
    parts[i] = rest.substr(0, at);
    rest = at == std::string_view::npos ? std::string_view() : rest.substr(at + 1);
  }
  return parts;
}

}  // namespace klein::fuzz
