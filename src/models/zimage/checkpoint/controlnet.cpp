#include "models/zimage/checkpoint/controlnet.h"

#include <regex>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_fields.h"
#include "models/zimage/checkpoint/units.h"

namespace klein::zimage {

namespace {

// A list of increasing indices below `bound`.
std::vector<int64_t> places(const nlohmann::json& j, const char* key, int64_t bound,
                            const char* what, const std::string& where) {
  check(j.contains(key) && j.at(key).is_array() && !j.at(key).empty(), where, ": \"", key,
        "\" must be a non-empty list of ", what, " indices");
  std::vector<int64_t> out;
  for (const nlohmann::json& v : j.at(key)) {
    check(v.is_number_integer(), where, ": \"", key, "\" holds ", v.dump(), ", not an index");
    const int64_t i = v.get<int64_t>();
    check(i >= 0 && i < bound, where, ": \"", key, "\" names ", what, " ", i,
          "; the transformer has ", bound);
    check(out.empty() || i > out.back(), where, ": \"", key, "\" must be increasing, got ",
          j.at(key).dump());
    out.push_back(i);
  }
  return out;
}

}  // namespace

ControlNetConfig parse_controlnet_config(const nlohmann::json& j, const std::string& where,
                                         const TransformerConfig& base) {
  check(j.is_object(), where, ": expected a JSON object");
  // The refiner stage names the version: null is Union 1.0, "control_layers" 2.0,
  // "control_noise_refiner" 2.1.
  const nlohmann::json refiner = j.value("add_control_noise_refiner", nlohmann::json(nullptr));
  check(refiner == "control_noise_refiner", where, ": add_control_noise_refiner is ",
        refiner.dump(), ": this control model is ",
        refiner.is_null() ? "Union 1.0" : refiner == "control_layers" ? "Union 2.0" : "unknown",
        "; only the Z-Image-Turbo-Fun-Controlnet-Union 2.1 structure (\"control_noise_refiner\") "
        "is supported");
  ControlNetConfig c;
  c.dim = base.dim;
  c.n_heads = base.n_heads;
  c.norm_eps = base.norm_eps;
  read_json_field(j, "dim", c.dim, where);
  read_json_field(j, "n_heads", c.n_heads, where);
  read_json_field(j, "norm_eps", c.norm_eps, where);
  read_json_field(j, "control_in_dim", c.in_channels, where);
  check(c.dim == base.dim && c.n_heads == base.n_heads, where, ": dim ", c.dim, " with ",
        c.n_heads, " heads; the transformer it controls has dim ", base.dim, " with ",
        base.n_heads, " heads (a control model of another model)");
  check(c.norm_eps == base.norm_eps, where, ": norm_eps ", c.norm_eps, " against the transformer's ",
        base.norm_eps);
  for (const char* key : {"all_patch_size", "all_f_patch_size"})
    if (j.contains(key)) {
      const int64_t want = std::string(key) == "all_patch_size" ? base.patch : base.frame_patch;
      check(j.at(key) == nlohmann::json::array({want}), where, ": \"", key, "\" is ",
            j.at(key).dump(), "; the transformer's is [", want, "]");
    }
  bool qk_norm = true;
  read_json_field(j, "qk_norm", qk_norm, where);
  check(qk_norm, where, ": qk_norm false is not supported");
  check(c.in_channels >= base.in_channels, where, ": control_in_dim ", c.in_channels,
        " is below the ", base.in_channels, " latent channels of a control image");
  c.layer_places = places(j, "control_layers_places", base.n_layers, "main layer", where);
  c.refiner_places =
      places(j, "control_refiner_layers_places", base.n_refiner_layers, "noise-refiner layer", where);
  return c;
}

std::string control_refiner_unit(int64_t j) { return "controlnet.refiner." + std::to_string(j); }
std::string control_layer_unit(int64_t j) { return "controlnet.layer." + std::to_string(j); }

std::optional<UnitOf> controlnet_unit_of(const std::string& canonical) {
  static const std::regex block(R"(^controlnet\.(control_noise_refiner|control_layers)\.(\d+)\..+$)");
  static const std::regex shared(R"(^controlnet\.control_all_x_embedder\..+$)");
  std::smatch m;
  if (std::regex_match(canonical, m, block)) {
    const std::string kind = m[1].str(), index = m[2].str();
    const std::string unit = kind == "control_layers" ? "layer" : "refiner";
    return UnitOf{"controlnet." + unit + "." + index, "controlnet." + kind + "." + index + "."};
  }
  if (std::regex_match(canonical, shared)) return UnitOf{"controlnet.shared", "controlnet."};
  return std::nullopt;
}

ShapeMap expected_controlnet(const ControlNetConfig& c, const TransformerConfig& base) {
  const int64_t D = c.dim;
  const int64_t P = base.frame_patch * base.patch * base.patch * c.in_channels;
  const std::string key = std::to_string(base.patch) + "-" + std::to_string(base.frame_patch);
  ShapeMap m;
  m["controlnet.control_all_x_embedder." + key + ".weight"] = {D, P};
  m["controlnet.control_all_x_embedder." + key + ".bias"] = {D};
  // Control blocks are modulated blocks of the transformer's shapes with their projections.
  auto block = [&](const std::string& p, bool first) {
    add_block_shapes(m, p, base, true);
    m[p + "after_proj.weight"] = {D, D};
    m[p + "after_proj.bias"] = {D};
    if (first) {
      m[p + "before_proj.weight"] = {D, D};
      m[p + "before_proj.bias"] = {D};
    }
  };
  for (size_t j = 0; j < c.refiner_places.size(); ++j)
    block("controlnet.control_noise_refiner." + std::to_string(j) + ".", j == 0);
  for (size_t j = 0; j < c.layer_places.size(); ++j)
    block("controlnet.control_layers." + std::to_string(j) + ".", j == 0);
  return m;
}

}  // namespace klein::zimage
