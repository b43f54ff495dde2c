#pragma once
// The tiny model converted to a container once per test run (header-only so that only the
// programs that link the converter use it).
#include <filesystem>
#include <string>
#include <utility>

#include "convert/convert.h"
#include "convert/policy.h"
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

// The tiny model converted by convert_tiny as a shared_fixture (once per test run; `type`
// "q8", "q4", "bf16", ...): read it, never write it.
inline std::filesystem::path shared_tiny_container(const std::string& type) {
  const std::string name = "tiny-" + type + ".klein";
  return shared_fixture(name, [&](const std::filesystem::path& dir) {
           convert_tiny(dir / name, convert::parse_storage_type(type, "test"));
           return true;
         }) / name;
}

}  // namespace klein::testing
