#pragma once
// The tiny model converted to a container once per test program (header-only so that only
// the programs that link the converter use it).
#include <filesystem>
#include <string>

#include "convert/convert.h"
#include "support/testing.h"

namespace klein::testing {

// tiny_model() as a Q8 container in a temporary directory named after `tag`.
inline const std::filesystem::path& tiny_q8_container(const std::string& tag) {
  static const std::filesystem::path path = [&] {
    convert::ConvertOptions o;
    o.source.model = tiny_model();
    o.output = temp_dir(tag) / "tiny-q8.klein";
    o.target = DType::Q8;
    convert::convert_model(o);
    return o.output;
  }();
  return path;
}

// tiny_model() as a Q4 container in a temporary directory named after `tag`.
inline const std::filesystem::path& tiny_q4_container(const std::string& tag) {
  static const std::filesystem::path path = [&] {
    convert::ConvertOptions o;
    o.source.model = tiny_model();
    o.output = temp_dir(tag) / "tiny-q4.klein";
    o.target = DType::Q4;
    convert::convert_model(o);
    return o.output;
  }();
  return path;
}

}  // namespace klein::testing
