#include "weights/safety_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "formats/safetensors.h"
#include "formats/container/reader.h"
#include "weights/component_store.h"
#include "weights/container_store.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kPrefix = "safety.";

json read_safety_json(const fs::path& path) {
  check(fs::is_regular_file(path), path.string(),
        ": missing (a safety classifier directory "
        "holds config.json, model.safetensors and preprocessor_config.json)");
  json j = json::parse(read_text_file(path), nullptr, false);
  check(!j.is_discarded(), path.string(), ": not valid JSON");
  check(j.is_object(), path.string(), ": expected a JSON object");
  return j;
}

void check_positive(int64_t v, const char* key, const std::string& where) {
  check(v > 0, where, ": \"", key, "\" must be positive, got ", v);
}

// id2label as a list in id order: keys "0" .. "L-1", each once, string values.
std::vector<std::string> read_labels(const json& j, const std::string& where) {
  check(j.contains("id2label") && j["id2label"].is_object() && !j["id2label"].empty(), where,
        ": no \"id2label\" object: expected the classifier's labels (\"normal\" and \"nsfw\")");
  const json& m = j["id2label"];
  std::vector<std::string> labels(m.size());
  std::vector<bool> seen(m.size(), false);
  for (const auto& [key, value] : m.items()) {
    size_t id = 0;
    const bool numeric =
        !key.empty() && key.size() <= 6 && key.find_first_not_of("0123456789") == std::string::npos;
    if (numeric) id = size_t(std::stoul(key));
    check(numeric && id < labels.size() && !seen[id], where, ": id2label key \"", key,
          "\" is not one of the ids 0..", labels.size() - 1, " (each once)");
    check(value.is_string(), where, ": id2label[\"", key, "\"] is not a string");
    labels[id] = value.get<std::string>();
    seen[id] = true;
  }
  return labels;
}

std::string labels_text(const std::vector<std::string>& labels) {
  std::string s;
  for (size_t i = 0; i < labels.size(); ++i)
    s += (i ? ", " : "") + std::to_string(i) + ": \"" + labels[i] + "\"";
  return "{" + s + "}";
}

}  // namespace

int64_t VitConfig::label_id(const std::string& label) const {
  auto it = std::find(labels.begin(), labels.end(), label);
  return it == labels.end() ? -1 : int64_t(it - labels.begin());
}

VitConfig parse_vit_config(const json& j, const std::string& where) {
  check(j.is_object(), where, ": expected a JSON object");
  std::string model_type;
  read_json_field(j, "model_type", model_type, where);
  check(model_type.empty() || model_type == "vit", where, ": model_type \"", model_type,
        "\" is not a ViT (expected \"vit\", a ViTForImageClassification)");
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      check(a.is_string() && a.get<std::string>() == "ViTForImageClassification", where,
            ": architectures lists ", a.dump(), "; expected ViTForImageClassification");
  VitConfig c;
  read_json_field(j, "hidden_size", c.hidden, where);
  read_json_field(j, "num_hidden_layers", c.num_layers, where);
  read_json_field(j, "num_attention_heads", c.num_heads, where);
  read_json_field(j, "intermediate_size", c.intermediate, where);
  read_json_field(j, "image_size", c.image_size, where);
  read_json_field(j, "patch_size", c.patch_size, where);
  read_json_field(j, "num_channels", c.channels, where);
  read_json_field(j, "layer_norm_eps", c.layer_norm_eps, where);
  check_positive(c.hidden, "hidden_size", where);
  check_positive(c.num_layers, "num_hidden_layers", where);
  check_positive(c.num_heads, "num_attention_heads", where);
  check_positive(c.intermediate, "intermediate_size", where);
  check_positive(c.image_size, "image_size", where);
  check_positive(c.patch_size, "patch_size", where);
  check(c.hidden % c.num_heads == 0, where, ": hidden_size ", c.hidden,
        " is not a multiple of num_attention_heads ", c.num_heads);
  check(c.image_size % c.patch_size == 0, where, ": image_size ", c.image_size,
        " is not a multiple of patch_size ", c.patch_size);
  check(
      c.hidden <= 65536 && c.intermediate <= 262144 && c.num_layers <= 1024 && c.image_size <= 4096,
      where, ": sizes beyond any ViT (hidden_size ", c.hidden, ", intermediate_size ",
      c.intermediate, ", num_hidden_layers ", c.num_layers, ", image_size ", c.image_size, ")");
  check(c.channels == 3, where, ": num_channels ", c.channels, "; expected 3 (RGB)");
  check(std::isfinite(c.layer_norm_eps) && c.layer_norm_eps > 0, where,
        ": layer_norm_eps must be positive, got ", c.layer_norm_eps);

  std::string act = "gelu";
  read_json_field(j, "hidden_act", act, where);
  check(act == "gelu", where, ": hidden_act \"", act,
        "\" is not supported; expected \"gelu\" (the exact erf GELU of ViT)");
  bool qkv_bias = true;
  read_json_field(j, "qkv_bias", qkv_bias, where);
  check(qkv_bias, where,
        ": qkv_bias false is not supported; expected true (ViT's query, key "
        "and value have biases)");
  std::string problem = "single_label_classification";
  read_json_field(j, "problem_type", problem, where);
  check(problem == "single_label_classification", where, ": problem_type \"", problem,
        "\"; expected single_label_classification (scores by softmax)");

  c.labels = read_labels(j, where);
  check(c.label_id("nsfw") >= 0 && c.label_id("normal") >= 0, where, ": id2label is ",
        labels_text(c.labels),
        "; expected a classifier with the labels \"normal\" and \"nsfw\" "
        "(Falconsai/nsfw_image_detection)");
  return c;
}

VitImageProcessor parse_vit_image_processor(const json& j, const std::string& where) {
  check(j.is_object(), where, ": expected a JSON object");
  std::string type = "ViTImageProcessor";
  read_json_field(j, "image_processor_type", type, where);
  check(type == "ViTImageProcessor", where, ": image_processor_type \"", type,
        "\"; expected ViTImageProcessor (the processor BFL's pipeline loads)");
  VitImageProcessor p;
  read_json_field(j, "do_resize", p.do_resize, where);
  read_json_field(j, "do_rescale", p.do_rescale, where);
  read_json_field(j, "do_normalize", p.do_normalize, where);
  read_json_field(j, "rescale_factor", p.rescale_factor, where);
  if (j.contains("size") && !j["size"].is_null()) {
    const json& s = j["size"];
    check(s.is_object() && s.size() == 2 && s.contains("height") && s.contains("width"), where,
          ": size ", s.dump(), "; expected {\"height\": H, \"width\": W}");
    int64_t h = 0, w = 0;
    read_json_field(s, "height", h, where + " (size)");
    read_json_field(s, "width", w, where + " (size)");
    check(h > 0 && w > 0 && h <= 4096 && w <= 4096, where, ": size ", h, "x", w,
          " is not a size to resize to");
    p.height = int(h);
    p.width = int(w);
  }
  int64_t resample = 2;
  read_json_field(j, "resample", resample, where);
  check(resample == 2, where, ": resample ", resample,
        " is not supported; expected 2 (PIL's BILINEAR, ViTImageProcessor's)");
  for (auto [key, into] :
       {std::pair{"image_mean", &p.image_mean}, std::pair{"image_std", &p.image_std}}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    const json& v = j[key];
    check(v.is_array() && v.size() == 3 &&
              std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number(); }),
          where, ": ", key, " ", v.dump(), "; expected 3 numbers (R, G, B)");
    for (size_t i = 0; i < 3; ++i) (*into)[i] = v[i].get<float>();
  }
  for (float s : p.image_std)
    check(std::isfinite(s) && s != 0.0f, where, ": image_std holds ", s,
          "; expected non-zero numbers");
  check(std::isfinite(p.rescale_factor), where, ": rescale_factor is not finite");
  return p;
}

std::string safety_layer_unit(int64_t layer) { return "safety.layer." + std::to_string(layer); }

std::optional<UnitOf> safety_unit_of(const std::string& name) {
  const std::string layers = "safety.vit.encoder.layer.";
  if (name.rfind(layers, 0) == 0) {
    const size_t dot = name.find('.', layers.size());
    const std::string index = name.substr(layers.size(), dot - layers.size());
    if (dot == std::string::npos || index.empty() || index.size() > 6 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    return UnitOf{safety_layer_unit(std::stoll(index)), layers + index + "."};
  }
  if (name.rfind("safety.vit.embeddings.", 0) == 0)
    return UnitOf{kSafetyEmbeddingsUnit, "safety.vit.embeddings."};
  if (name.rfind("safety.vit.layernorm.", 0) == 0 || name.rfind("safety.classifier.", 0) == 0)
    return UnitOf{kSafetyHeadUnit, "safety."};
  return std::nullopt;
}

ShapeMap expected_safety_tensors(const VitConfig& c) {
  const int64_t D = c.hidden, F = c.intermediate;
  ShapeMap m;
  const std::string e = "safety.vit.embeddings.";
  m[e + "cls_token"] = {1, 1, D};
  m[e + "position_embeddings"] = {1, c.tokens(), D};
  m[e + "patch_embeddings.projection.weight"] = {D, c.channels, c.patch_size, c.patch_size};
  m[e + "patch_embeddings.projection.bias"] = {D};
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string l = "safety.vit.encoder.layer." + std::to_string(i) + ".";
    for (const char* norm : {"layernorm_before", "layernorm_after"}) {
      m[l + norm + ".weight"] = {D};
      m[l + norm + ".bias"] = {D};
    }
    for (const char* p : {"attention.attention.query", "attention.attention.key",
                          "attention.attention.value", "attention.output.dense"}) {
      m[l + p + ".weight"] = {D, D};
      m[l + p + ".bias"] = {D};
    }
    m[l + "intermediate.dense.weight"] = {F, D};
    m[l + "intermediate.dense.bias"] = {F};
    m[l + "output.dense.weight"] = {D, F};
    m[l + "output.dense.bias"] = {D};
  }
  m["safety.vit.layernorm.weight"] = {D};
  m["safety.vit.layernorm.bias"] = {D};
  const int64_t L = int64_t(c.labels.size());
  m["safety.classifier.weight"] = {L, D};
  m["safety.classifier.bias"] = {L};
  return m;
}

namespace {

// A classifier's units in a container, behind the store a SafetyModel owns (the container is
// opened again: a mapping of the same file, its units checked as they are read).
SafetyModel open_container_safety_model(const fs::path& path) {
  auto store = std::make_unique<ContainerStore>(path);
  const json& meta = store->file().metadata();
  check(meta.contains("safety") && meta["safety"].is_object(), path.string(),
        ": the container holds no safety classifier (convert with --safety-model DIR, or give "
        "the classifier's directory)");
  const std::string where = path.string() + " (safety classifier)";
  SafetyModel model = safety_model_from_metadata(meta["safety"], where);
  model.path = path;
  const ShapeMap expected = expected_safety_tensors(model.config);
  std::set<std::string> units;
  for (const auto& [name, shape] : expected) units.insert(safety_unit_of(name)->unit);
  for (const std::string& unit : units) {
    check(store->has_unit(unit), where, ": unit ", unit, " is missing");
    const UnitRef ref = store->describe(unit);
    for (const Weight& w : ref->weights()) {
      const auto it = expected.find(w.name);
      check(it != expected.end(), where, ": tensor ", w.name, " is not one of its classifier");
      check(w.shape == it->second, where, ": tensor ", w.name, " has shape ", shape_str(w.shape),
            "; expected ", shape_str(it->second));
    }
  }
  model.store = std::move(store);
  return model;
}

}  // namespace

SafetyModel safety_model_from_metadata(const json& s, const std::string& where) {
  check(s.is_object() && s.contains("config") && s["config"].is_object() &&
            s.contains("preprocessor_config") && s["preprocessor_config"].is_object(),
        where, ": the metadata lacks its config or preprocessor_config");
  SafetyModel model;
  model.config_json = s["config"];
  model.processor_json = s["preprocessor_config"];
  model.config = parse_vit_config(model.config_json, where + " config");
  model.processor = parse_vit_image_processor(model.processor_json, where + " preprocessor_config");
  (void)expected_safety_tensors(model.config);  // a configuration whose tensors cannot be named
  return model;
}

bool container_has_safety_model(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || !container::is_container(path)) return false;
  const ContainerStore store(path);
  return store.file().metadata().contains("safety");
}

json safety_container_metadata(const SafetyModel& model) {
  return {{"config", model.config_json},
          {"preprocessor_config", model.processor_json},
          {"source", model.path.filename().string()}};
}

ExtraComponent safety_component(SafetyModel model) {
  ExtraComponent e;
  e.key = "safety";
  e.title = "the safety classifier";
  e.metadata = safety_container_metadata(model);
  e.store = std::move(model.store);
  return e;
}

SafetyModel open_safety_model(const fs::path& dir) {
  if (fs::is_regular_file(dir) && container::is_container(dir)) return open_container_safety_model(dir);
  check(fs::exists(dir), "safety model ", dir.string(), " does not exist");
  check(fs::is_directory(dir), "safety model ", dir.string(),
        " is not a directory (expected "
        "the Hugging Face directory of Falconsai/nsfw_image_detection: config.json, "
        "model.safetensors, preprocessor_config.json)");
  SafetyModel model;
  model.path = dir;
  const fs::path config_file = dir / "config.json";
  const fs::path processor_file = dir / "preprocessor_config.json";
  model.config_json = read_safety_json(config_file);
  model.processor_json = read_safety_json(processor_file);
  model.config = parse_vit_config(model.config_json, config_file.string());
  model.processor = parse_vit_image_processor(model.processor_json, processor_file.string());
  const VitConfig& c = model.config;
  check(!model.processor.do_resize ||
            (model.processor.height == c.image_size && model.processor.width == c.image_size),
        processor_file.string(), ": size ", model.processor.height, "x", model.processor.width,
        " is not the model's image_size ", c.image_size, " (", config_file.string(), ")");

  fs::path weights = dir / "model.safetensors.index.json";
  if (!fs::exists(weights)) weights = dir / "model.safetensors";
  check(fs::exists(weights), dir.string(), ": no model.safetensors (or its .index.json) found");
  auto files = std::make_unique<SafetensorsSet>(weights);
  const std::string where = weights.string();

  // Every tensor expected, of a float type and its shape; nothing else.
  const ShapeMap expected = expected_safety_tensors(c);
  std::set<std::string> found;
  for (const auto& t : files->tensors()) {
    const std::string canonical = kPrefix + t.entry->name;
    auto it = expected.find(canonical);
    check(it != expected.end(), where, ": tensor ", t.entry->name,
          " is not one of a ViTForImageClassification of ", config_file.string(),
          " (another layout or model)");
    check(dtype_is_float(t.entry->dtype), where, ": tensor ", t.entry->name, " is ",
          dtype_name(t.entry->dtype), "; expected F32, BF16 or F16");
    check(t.entry->shape == it->second, where, ": tensor ", t.entry->name, " has shape ",
          shape_str(t.entry->shape), "; expected ", shape_str(it->second), " for ",
          config_file.string(), " (hidden_size ", c.hidden, ", intermediate_size ", c.intermediate,
          ", image_size ", c.image_size, ", patch_size ", c.patch_size, ", ", c.labels.size(),
          " labels)");
    found.insert(canonical);
  }
  for (const auto& [name, shape] : expected)
    check(found.count(name), where, ": tensor ", name.substr(std::string(kPrefix).size()), " ",
          shape_str(shape), " is missing (", config_file.string(), " has ", c.num_layers,
          " layers)");

  model.store = std::make_unique<ComponentStore>(std::move(files), kPrefix, safety_unit_of,
                                                 fs::absolute(dir).lexically_normal().string(),
                                                 "the safety classifier");
  return model;
}

}  // namespace klein
