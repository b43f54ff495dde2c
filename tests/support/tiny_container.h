#pragma once
// The tiny model converted to a container once per test program (header-only so that only
// the programs that link the converter use it).
#include <filesystem>
#include <string>
#include <utility>

#include "convert/convert.h"
#include "support/testing.h"

namespace klein::testing {

// tiny_model() converted to `type` at `output` (its directory must exist).
inline std::filesystem::path convert_tiny(std::filesystem::path output, DType type) {
  convert::ConvertOptions o;
  o.source.model = tiny_model();
  o.output = std::move(output);
  o.target = type;
  convert::convert_model(o);
  return o.output;
}

// tiny_model() as a Q8 (Q4) container in a temporary directory named after `tag`, made once.
inline const std::filesystem::path& tiny_q8_container(const std::string& tag) {
  static const std::filesystem::path path =
      convert_tiny(temp_dir(tag) / "tiny-q8.klein", DType::Q8);
  return path;
}
inline const std::filesystem::path& tiny_q4_container(const std::string& tag) {
  static const std::filesystem::path path =
      convert_tiny(temp_dir(tag) / "tiny-q4.klein", DType::Q4);
  return path;
}

}  // namespace klein::testing
