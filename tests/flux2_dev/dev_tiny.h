#pragma once
// The tiny FLUX.2-dev of tests/data/flux2-dev-tiny (tools/refgen/gen_dev.py): paths, its
// configuration as the engine reads it, and weight stores over its component files with the
// tensors under the names the engine's models read.
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/testing.h"
#include "weights/config.h"
#include "weights/naming.h"
#include "zimage/file_store.h"

namespace klein::testing {

inline std::filesystem::path dev_dir() {
  return std::filesystem::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "flux2-dev-tiny";
}
inline std::filesystem::path dev_vectors() { return dev_dir() / "vectors"; }

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The language model of the Mistral3 text encoder: "language_model.model.*" is what the
// decoder reads ("text_encoder.model.*" in klein's canonical spelling); the vision tower,
// projector and lm_head are left out.
inline std::optional<UnitOf> dev_text_unit_of(const std::string& name) {
  const std::string stored = "text_encoder.language_model.model.";
  if (name.rfind(stored, 0) != 0) return std::nullopt;
  const std::optional<UnitOf> u = component_unit_of("text_encoder.model." + name.substr(stored.size()));
  if (!u) return std::nullopt;
  return UnitOf{u->unit, "text_encoder.language_model." + u->prefix.substr(std::string("text_encoder.").size())};
}

inline ModelConfig dev_config() {
  ModelConfig c;
  c.transformer = parse_transformer_config(
      read_json_file(dev_dir() / "model" / "transformer" / "config.json"), "dev transformer");
  c.text_encoder = parse_text_encoder_config(
      read_json_file(dev_dir() / "model" / "text_encoder" / "config.json"), "dev text encoder",
      {10, 20, 30});
  c.scheduler = parse_scheduler_config(
      read_json_file(dev_dir() / "model" / "scheduler" / "scheduler_config.json"), "dev scheduler");
  c.is_distilled = true;  // Flux2Pipeline: no classifier-free guidance pass
  return c;
}

}  // namespace klein::testing
