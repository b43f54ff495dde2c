#include "families/zimage/controlnet.h"

#include <algorithm>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "formats/safetensors.h"
#include "weights/component_store.h"

namespace klein::zimage {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPrefix = "controlnet.";

// The configuration of an original single file, from its tensors (see controlnet.h).
json single_file_config(const SafetensorsSet& files, const TransformerConfig& base,
                        const std::string& where) {
  // At most 4 digits: an index past that is no block of a real control model (the tensor is
  // then refused as unknown below), and stoll cannot overflow.
  static const std::regex block(R"(^(control_noise_refiner|control_layers)\.(\d{1,4})\..+$)");
  int64_t layers = 0, refiners = 0, embedder_width = -1;
  const SafetensorsSet::Located* first_before = nullptr;
  const std::string embedder = "control_all_x_embedder." + std::to_string(base.patch) + "-" +
                               std::to_string(base.frame_patch) + ".weight";
  for (const auto& t : files.tensors()) {
    std::smatch m;
    const std::string& name = t.entry->name;
    if (std::regex_match(name, m, block)) {
      const int64_t n = std::stoll(m[2].str()) + 1;
      int64_t& count = m[1].str() == "control_layers" ? layers : refiners;
      count = std::max(count, n);
    }
    if (name == embedder && t.entry->shape.size() == 2) embedder_width = t.entry->shape[1];
    if (name == "control_noise_refiner.0.before_proj.weight") first_before = &t;
  }
  check(embedder_width > 0 && layers > 0, where, ": not a Z-Image control model (no ", embedder,
        " or control_layers.* tensors)");
  // Union 1.0's refiner blocks have no before_proj; 2.0's file has none or zeros there.
  bool refiner_2_1 = false;
  if (first_before) {
    const TensorView v = first_before->file->view(*first_before->entry);
    const auto* bytes = static_cast<const unsigned char*>(v.data);
    refiner_2_1 = std::any_of(bytes, bytes + v.nbytes, [](unsigned char b) { return b != 0; });
  }
  json j;
  if (refiner_2_1)
    j["add_control_noise_refiner"] = "control_noise_refiner";
  else if (refiners > 0 && !first_before)
    j["add_control_noise_refiner"] = nullptr;  // Union 1.0: plain refiner blocks
  else
    j["add_control_noise_refiner"] = "control_layers";  // 2.0
  j["control_in_dim"] = embedder_width / (base.patch * base.patch * base.frame_patch);
  j["dim"] = base.dim;
  j["n_heads"] = base.n_heads;
  j["control_layers_places"] = json::array();
  for (int64_t i = 0; i < layers; ++i) j["control_layers_places"].push_back(2 * i);
  j["control_refiner_layers_places"] = json::array();
  for (int64_t i = 0; i < refiners; ++i) j["control_refiner_layers_places"].push_back(i);
  return j;
}

}  // namespace

ControlModel open_control_model(const fs::path& path, const TransformerConfig& base) {
  check(fs::exists(path), "--controlnet ", path.string(), ": does not exist");
  ControlModel model;
  model.path = path;
  fs::path weights;
  json config;
  std::string config_where;
  if (fs::is_directory(path)) {
    config_where = (path / "config.json").string();
    check(fs::is_regular_file(path / "config.json"), "--controlnet ", path.string(),
          ": no config.json (a diffusers ZImageControlNetModel directory holds config.json and "
          "diffusion_pytorch_model.safetensors)");
    config = json::parse(read_text_file(path / "config.json"), nullptr, false);
    check(!config.is_discarded(), config_where, ": not valid JSON");
    weights = path / "diffusion_pytorch_model.safetensors.index.json";
    if (!fs::exists(weights)) weights = path / "diffusion_pytorch_model.safetensors";
    check(fs::exists(weights), "--controlnet ", path.string(),
          ": no diffusion_pytorch_model.safetensors (or its .index.json)");
  } else {
    check(path.extension() == ".safetensors", "--controlnet ", path.string(),
          ": expected a diffusers directory or the original .safetensors file (Z-Image-Turbo-"
          "Fun-Controlnet-Union-2.1.safetensors)");
    weights = path;
  }
  auto files = std::make_unique<SafetensorsSet>(weights);
  const std::string where = weights.string();
  if (config.is_null()) {
    config = single_file_config(*files, base, where);
    config_where = where + " (its tensors)";
  }
  model.config = parse_controlnet_config(config, config_where, base);
  model.config_json = config;

  // Every expected tensor, of a float type and its shape; nothing else.
  const ShapeMap expected = expected_controlnet(model.config, base);
  std::set<std::string> found;
  for (const auto& t : files->tensors()) {
    const std::string canonical = kPrefix + t.entry->name;
    auto it = expected.find(canonical);
    check(it != expected.end(), where, ": tensor ", t.entry->name, " is not one of the control "
          "model of ", config_where, " (", model.config.layer_places.size(), " control layers, ",
          model.config.refiner_places.size(), " refiner blocks)");
    check(dtype_is_float(t.entry->dtype), where, ": tensor ", t.entry->name, " is ",
          dtype_name(t.entry->dtype), "; expected F32, BF16 or F16");
    check(t.entry->shape == it->second, where, ": tensor ", t.entry->name, " has shape ",
          shape_str(t.entry->shape), "; expected ", shape_str(it->second),
          " for the transformer it controls");
    found.insert(canonical);
  }
  for (const auto& [name, shape] : expected)
    check(found.count(name), where, ": tensor ", name.substr(std::string(kPrefix).size()), " ",
          shape_str(shape), " is missing");
  model.store = std::make_shared<ComponentStore>(std::move(files), kPrefix, controlnet_unit_of,
                                                 fs::absolute(path).lexically_normal().string(),
                                                 "the control model");
  model.units = model.store->units();
  return model;
}

std::optional<ControlModel> stored_control_model(WeightStore& weights,
                                                 const TransformerConfig& base) {
  const StoreOrigin origin = weights.origin();
  const json* meta = origin.container_metadata;
  if (!meta || !meta->contains("controlnet")) return std::nullopt;
  const std::string where =
      (origin.files.empty() ? std::string("the container") : origin.files[0].string()) +
      " (control model)";
  const json& stored = (*meta)["controlnet"];
  check(stored.is_object() && stored.contains("config"), where,
        ": the metadata's \"controlnet\" object has no \"config\"");
  ControlModel model;
  model.config_json = stored["config"];
  model.config = parse_controlnet_config(model.config_json, where, base);
  model.path = origin.files.empty() ? fs::path() : origin.files[0];
  // Its units and every tensor's shape, from the index (nothing is read).
  const ShapeMap expected = expected_controlnet(model.config, base);
  std::set<std::string> units;
  for (const auto& [name, shape] : expected) units.insert(controlnet_unit_of(name)->unit);
  size_t seen = 0;
  for (const std::string& unit : units) {
    check(weights.has_unit(unit), where, ": unit ", unit, " is missing");
    const UnitRef ref = weights.describe(unit);
    for (const Weight& w : ref->weights()) {
      const auto it = expected.find(w.name);
      check(it != expected.end(), where, ": tensor ", w.name, " is not one of its control model");
      check(w.shape == it->second, where, ": tensor ", w.name, " has shape ", shape_str(w.shape),
            "; expected ", shape_str(it->second));
      ++seen;
    }
  }
  check(seen == expected.size(), where, ": ", expected.size() - seen, " of its ", expected.size(),
        " tensors are missing");
  model.units.assign(units.begin(), units.end());
  // The session's store, not owned.
  model.store = std::shared_ptr<WeightStore>(std::shared_ptr<WeightStore>(), &weights);
  return model;
}

ExtraComponent control_component(ControlModel model) {
  ExtraComponent e;
  e.key = "controlnet";
  e.title = "the control model";
  const ControlNetConfig& c = model.config;
  e.metadata = {{"config", model.config_json},
                {"source", model.path.filename().string()},
                {"summary", "Z-Image ControlNet Union 2.1: " +
                                std::to_string(c.layer_places.size()) + " control layers, " +
                                std::to_string(c.refiner_places.size()) +
                                " refiner blocks, control_in_dim " + std::to_string(c.in_channels)}};
  e.store = std::move(model.store);
  return e;
}

}  // namespace klein::zimage
