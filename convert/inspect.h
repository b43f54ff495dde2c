#pragma once
// Describing and verifying a container: what `klein inspect FILE` and `klein verify FILE`
// print, as data (the CLI only prints).
#include <cstddef>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "formats/container/reader.h"

namespace klein::convert {

// The container as JSON: file, format version, alignment, sizes; per storage type and per
// unit the tensors, parameters, bytes and bits per weight; the model configuration; the
// conversion record; the tokenizer files (names and sizes, not their text); and, with
// `tensors`, every tensor (name, type, layout, block size, shape, offset, bytes, bits per
// weight, checksum).
nlohmann::json describe_container(const std::filesystem::path& path, bool tensors = true);

// The same as readable text (units one per line; configuration and record summarised).
std::string describe_container_text(const nlohmann::json& description);

struct VerifyOutcome {
  container::VerifyReport data;    // checksums of every unit and tensor, padding
  std::vector<std::string> model;  // model-level problems (config, tensors, sizes)
  bool ok() const { return data.ok() && model.empty(); }
};

// Checks everything in a container: header, index and metadata (a problem there is thrown as
// klein::Error naming the region, since nothing after it can be trusted), the model
// configuration and the tensors it implies, and every byte of every unit and tensor.
VerifyOutcome verify_model_container(const std::filesystem::path& path,
                                     const std::function<void(size_t, size_t)>& progress = {});

}  // namespace klein::convert
