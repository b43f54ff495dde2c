#include "models/zimage/checkpoint/config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_fields.h"

namespace klein::zimage {

namespace {

template <class T>
void read(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
  read_json_field(j, key, out, where);  // a missing key keeps the class default, as diffusers does
}

// all_patch_size / all_f_patch_size: one entry each.
int64_t single(const nlohmann::json& j, const char* key, int64_t fallback,
               const std::string& where) {
  if (!j.contains(key)) return fallback;
  const nlohmann::json& v = j.at(key);
  check(v.is_array() && v.size() == 1 && v[0].is_number_integer(), where, ": \"", key,
        "\" must be a list of one integer, got ", v.dump());
  return v[0].get<int64_t>();
}

}  // namespace

TransformerConfig parse_transformer_config(const nlohmann::json& j, const std::string& where) {
  check(j.is_object(), where, ": expected a JSON object");
  TransformerConfig c;
  c.patch = single(j, "all_patch_size", c.patch, where);
  c.frame_patch = single(j, "all_f_patch_size", c.frame_patch, where);
  read(j, "in_channels", c.in_channels, where);
  read(j, "dim", c.dim, where);
  read(j, "n_layers", c.n_layers, where);
  read(j, "n_refiner_layers", c.n_refiner_layers, where);
  read(j, "n_heads", c.n_heads, where);
  read(j, "norm_eps", c.norm_eps, where);
  read(j, "rope_theta", c.rope_theta, where);
  read(j, "t_scale", c.t_scale, where);
  read(j, "axes_dims", c.axes_dims, where);
  read(j, "axes_lens", c.axes_lens, where);
  read(j, "cap_feat_dim", c.cap_feat_dim, where);
  // n_kv_heads is in the file but the official blocks project keys and values to the full
  // width with n_heads heads: it changes nothing, so it is not read.
  bool qk_norm = true;
  read(j, "qk_norm", qk_norm, where);
  check(qk_norm, where, ": qk_norm false is not supported (Z-Image normalises queries and keys)");
  check(!j.contains("siglip_feat_dim") || j.at("siglip_feat_dim").is_null(), where,
        ": siglip_feat_dim is set: the Omni variant (image conditioning) is not supported");
  check(c.patch == 2 && c.frame_patch == 1, where, ": patch sizes ", c.patch, " / ", c.frame_patch,
        " are not supported (all_patch_size [2], all_f_patch_size [1])");
  check(c.in_channels > 0 && c.dim > 0 && c.n_heads > 0 && c.dim % c.n_heads == 0, where, ": dim ",
        c.dim, " must be a positive multiple of n_heads ", c.n_heads);
  check(c.n_layers > 0 && c.n_refiner_layers >= 0 && c.cap_feat_dim > 0, where,
        ": n_layers, n_refiner_layers and cap_feat_dim must be positive");
  check(c.axes_dims[0] + c.axes_dims[1] + c.axes_dims[2] == c.head_dim(), where,
        ": axes_dims must sum to the head width dim / n_heads = ", c.head_dim());
  return c;
}

nlohmann::json to_json(const TransformerConfig& c) {
  return {{"all_patch_size", {c.patch}},  {"all_f_patch_size", {c.frame_patch}},
          {"in_channels", c.in_channels}, {"dim", c.dim},
          {"n_layers", c.n_layers},       {"n_refiner_layers", c.n_refiner_layers},
          {"n_heads", c.n_heads},         {"norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},   {"t_scale", c.t_scale},
          {"axes_dims", c.axes_dims},     {"axes_lens", c.axes_lens},
          {"cap_feat_dim", c.cap_feat_dim}, {"qk_norm", true}};
}

}  // namespace klein::zimage
