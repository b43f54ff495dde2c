#include "families/zimage/checkpoint.h"

#include <cctype>
#include <filesystem>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/json_fields.h"
#include "families/zimage/controlnet.h"
#include "models/zimage/checkpoint/config.h"
#include "models/zimage/checkpoint/units.h"
#include "weights/expected.h"

namespace klein::zimage {

namespace {

using json = nlohmann::json;

// Source names without the prefixes single files carry.
std::string strip_prefix(const std::string& name) {
  for (std::string_view p : {"model.diffusion_model.", "diffusion_model.", "transformer."})
    if (name.starts_with(p)) return name.substr(p.size());
  return name;
}

const Shape& shape_of(const ShapeMap& m, const std::string& name, const std::string& where) {
  auto it = m.find(name);
  check(it != m.end(), where, ": missing tensor ", name);
  return it->second;
}

// The original Z-Image names (Tongyi-MAI's repository; ComfyUI's single files and GGUF files
// keep them) that diffusers renames (its single-file conversion,
// convert_z_image_transformer_checkpoint_to_diffusers): the diffusers name, or nothing for a
// name both spell the same. The fused attention.qkv and the unused final norm are handled by
// map_transformer.
constexpr std::string_view kFusedQkv = ".attention.qkv.weight";
constexpr std::string_view kUnusedFinalNorm = "norm_final.weight";
std::optional<std::string> original_name(const std::string& name) {
  static const std::pair<std::string_view, std::string_view> prefixes[] = {
      {"final_layer.", "all_final_layer.2-1."}, {"x_embedder.", "all_x_embedder.2-1."}};
  for (const auto& [from, to] : prefixes)
    if (name.starts_with(from)) return std::string(to) + name.substr(from.size());
  static const std::pair<std::string_view, std::string_view> parts[] = {
      {".attention.out.", ".attention.to_out.0."},
      {".attention.q_norm.", ".attention.norm_q."},
      {".attention.k_norm.", ".attention.norm_k."}};
  for (const auto& [from, to] : parts)
    if (const size_t at = name.find(from); at != std::string::npos)
      return name.substr(0, at) + std::string(to) + name.substr(at + from.size());
  if (name.ends_with(kFusedQkv) || name == kUnusedFinalNorm) return name;
  return std::nullopt;
}

// A kohya / musubi LoRA module ("lora_unet_layers_0_attention_to_q") in the dotted spelling:
// every '_' becomes '.', except inside the names that keep theirs (to_q, to_k, to_v, to_out,
// feed_forward, the refiners, adaLN_modulation, the embedders and the final layer), as
// diffusers' _convert_non_diffusers_z_image_lora_to_diffusers reads them.
std::string kohya_module(const std::string& module) {
  static const std::string_view kept[] = {"noise_refiner",
                                          "context_refiner",
                                          "adaLN_modulation",
                                          "all_final_layer",
                                          "all_x_embedder",
                                          "cap_embedder",
                                          "t_embedder",
                                          "feed_forward",
                                          "to_q",
                                          "to_k",
                                          "to_v",
                                          "to_out"};
  const std::string rest = module.substr(std::string_view("lora_unet_").size());
  std::string out;
  size_t i = 0;
  while (i < rest.size()) {
    bool matched = false;
    for (std::string_view k : kept) {
      const size_t end = i + k.size();
      if (rest.compare(i, k.size(), k) == 0 && (end == rest.size() || rest[end] == '_')) {
        out += k;
        i = end;
        matched = true;
        break;
      }
    }
    if (!matched) {
      const size_t end = std::min(rest.find('_', i), rest.size());
      out += rest.substr(i, end - i);
      i = end;
    }
    if (i < rest.size()) {  // the '_' between two parts
      out += '.';
      ++i;
    }
  }
  return out;
}

class ZImage final : public ModelFamily {
 public:
  std::string_view id() const override { return "z-image"; }
  std::string_view title() const override { return "Z-Image"; }
  std::vector<std::string> pipeline_classes() const override { return {"ZImagePipeline"}; }
  bool recognises_transformer(const std::vector<NamedShape>& tensors) const override {
    for (const auto& t : tensors) {
      const std::string n = strip_prefix(t.name);
      if (n.starts_with("cap_embedder.") || n.starts_with("context_refiner.")) return true;
    }
    return false;
  }

  Layout transformer_layout(const std::vector<NamedShape>& tensors) const override {
    for (const auto& t : tensors)
      if (original_name(strip_prefix(t.name))) return Layout::Original;
    return Layout::Diffusers;
  }
  std::vector<TensorSource> map_transformer(const std::vector<NamedShape>& tensors,
                                            const std::string& where) const override {
    std::vector<TensorSource> out;
    std::vector<std::string> unknown;
    for (const auto& t : tensors) {
      const std::string name = strip_prefix(t.name);
      if (name == kUnusedFinalNorm) {  // no unit: dropped, as diffusers drops it
        out.push_back({"transformer." + name, t.name});
        continue;
      }
      if (name.ends_with(kFusedQkv)) {
        // [3 x dim, dim]: the rows of to_q, to_k and to_v, one after the other.
        const std::string block = name.substr(0, name.size() - kFusedQkv.size());
        check(t.shape.size() == 2 && t.shape[0] % 3 == 0, where, ": ", t.name, " has shape ",
              shape_str(t.shape), "; a fused q/k/v projection has 3 x dim rows");
        const int64_t d = t.shape[0] / 3;
        const char* parts[] = {".attention.to_q.weight", ".attention.to_k.weight",
                               ".attention.to_v.weight"};
        for (int64_t i = 0; i < 3; ++i)
          out.push_back({"transformer." + block + parts[i], t.name, i * d, (i + 1) * d});
        continue;
      }
      const std::string canonical = "transformer." + original_name(name).value_or(name);
      if (transformer_unit_of(canonical))
        out.push_back({canonical, t.name});
      else
        unknown.push_back(t.name);
    }
    if (!unknown.empty()) {
      std::string list;
      for (size_t i = 0; i < unknown.size() && i < 5; ++i) list += "\n  " + unknown[i];
      if (unknown.size() > 5) list += "\n  ... and " + std::to_string(unknown.size() - 5) + " more";
      fail(where, ": ", unknown.size(),
           " tensor(s) are not Z-Image transformer tensors (diffusers "
           "or original names):",
           list);
    }
    return out;
  }
  std::optional<UnitOf> transformer_unit_of(const std::string& canonical) const override {
    return zimage::transformer_unit_of(canonical);
  }
  ExtraComponent open_control_model(const std::filesystem::path& path,
                                    const ModelConfig& c) const override {
    return control_component(
        zimage::open_control_model(path, parse_transformer_config(c.family_transformer, c.name)));
  }
  std::optional<UnitOf> control_unit_of(const std::string& canonical) const override {
    return zimage::controlnet_unit_of(canonical);
  }
  // LoRA modules: diffusers/PEFT ("transformer.layers.0.attention.to_q"), the original names
  // ComfyUI and musubi-tuner write ("diffusion_model.layers.0.attention.qkv": to_q, to_k and
  // to_v, B in thirds; "attention.out" for to_out.0) and kohya's underscores.
  std::vector<TensorSource> lora_targets(const std::string& module, const Shape& up,
                                         const std::string& where) const override {
    std::string name = module;
    if (name.starts_with("base_model.model.")) name = name.substr(17);
    name = strip_prefix(name);
    if (name.starts_with("lora_unet_")) name = kohya_module(name);
    name += ".weight";
    if (name.ends_with(kFusedQkv)) return map_transformer({{name, up}}, where);
    return {{"transformer." + original_name(name).value_or(name), module}};
  }
  ShapeMap expected_transformer(const ModelConfig& c) const override {
    return zimage::expected_transformer(
        parse_transformer_config(c.family_transformer, "the Z-Image configuration"));
  }

  void read_transformer_config(const json& j, const ShapeMap* shapes, const std::string& where,
                               const std::string& weights_file, ModelConfig& c) const override {
    const TransformerConfig a = parse_transformer_config(j, where);
    c.family_transformer = to_json(a);
    if (!shapes) return;
    const TransformerConfig b = infer(*shapes, weights_file);
    const std::tuple<int64_t, int64_t, const char*> fields[] = {
        {a.dim, b.dim, "dim"},
        {a.n_heads, b.n_heads, "n_heads"},
        {a.n_layers, b.n_layers, "n_layers"},
        {a.n_refiner_layers, b.n_refiner_layers, "n_refiner_layers"},
        {a.cap_feat_dim, b.cap_feat_dim, "cap_feat_dim"},
        {a.in_channels, b.in_channels, "in_channels"}};
    for (const auto& [file, weights, key] : fields)
      check_config_matches_weights(where, key, file, weights);
  }
  void infer_transformer_config(const ShapeMap& shapes, const std::string& where,
                                ModelConfig& c) const override {
    c.family_transformer = to_json(infer(shapes, where));
  }
  json transformer_config_json(const ModelConfig& c) const override { return c.family_transformer; }

  std::vector<int64_t> text_output_layers(int64_t num_layers) const override {
    // hidden_states[-2]: the output of the last layer but one.
    check(num_layers >= 2, "the text encoder has ", num_layers,
          " layer(s); Z-Image reads the output of the last layer but one");
    return {num_layers - 1};
  }
  // The FLUX.1 VAE: its latents are scaled and shifted, with the factors of its published
  // config.json (Z-Image-Turbo's vae/config.json has the same).
  void set_vae_latents(VaeConfig& v, bool from_config) const override {
    v.latent_batch_norm = false;
    if (from_config) return;
    v.scaling_factor = 0.3611;
    v.shift_factor = 0.1159;
  }
  // Z-Image-Turbo's scheduler_config.json: a static shift of 3.
  SchedulerConfig default_scheduler() const override {
    SchedulerConfig s;
    s.use_dynamic_shifting = false;
    s.shift = 3.0;
    return s;
  }

  // Z-Image-Turbo (distilled: few steps, no guidance) and Z-Image (the base model: CFG, many
  // steps) have the same layout and the same model_index.json; only the defaults differ
  // (ModelConfig::is_distilled). A directory is Turbo, the model published first, unless
  // --variant says otherwise; a single file is what its name says.
  void read_model_index(const json&, ModelConfig& c) const override { c.is_distilled = true; }
  std::vector<std::string> variant_names() const override { return {"zimage-turbo", "zimage"}; }
  std::vector<PublishedModel> published_models() const override {
    return {{"zimage-turbo", "Z-Image-Turbo (6B, Qwen3-4B, FLUX.1 VAE; about 20 GB)"}};
  }
  // Z-Image-Turbo (Tongyi-MAI/Z-Image-Turbo's config files): the transformer's defaults
  // (zimage::TransformerConfig: 30 + 2 + 2 layers of width 3840, 30 heads), Qwen3-4B read at
  // its last layer but one, the FLUX.1 VAE (16 latent channels, no quant convs, scaling 0.3611,
  // shift 0.1159) and a static shift of 3.
  ModelConfig published_config(const std::string& name) const override {
    check(name == "zimage-turbo", "Z-Image has no published model \"", name, "\"");
    ModelConfig c;
    c.family = "z-image";
    c.family_transformer = to_json(TransformerConfig{});
    c.text_encoder.output_layers = {c.text_encoder.num_layers - 1};
    c.vae.latent_channels = 16;
    c.vae.use_quant_conv = false;
    c.vae.use_post_quant_conv = false;
    c.vae.latent_batch_norm = false;
    c.vae.scaling_factor = 0.3611;
    c.vae.shift_factor = 0.1159;
    c.scheduler.use_dynamic_shifting = false;
    c.scheduler.shift = 3.0;
    return c;
  }
  std::string variants_help() const override {
    return "zimage-turbo: Z-Image-Turbo, 8 steps without guidance; zimage: Z-Image, 50 steps "
           "with CFG";
  }
  std::string variant_name(const ModelConfig& c) const override {
    return c.is_distilled ? "zimage-turbo" : "zimage";
  }
  void apply_variant(const std::string& variant, bool, const std::string& where,
                     ModelConfig& c) const override {
    if (variant.empty()) return;
    check(variant == "zimage-turbo" || variant == "zimage", "--variant ", variant, ": ", where,
          " is a Z-Image model; expected zimage-turbo or zimage");
    c.is_distilled = variant == "zimage-turbo";
  }
  void decide_undeclared_variant(const std::string& transformer_file,
                                 ModelConfig& c) const override {
    std::string name = std::filesystem::path(transformer_file).filename().string();
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (name.find("turbo") != std::string::npos) {
      c.is_distilled = true;
    } else {
      c.undecided_variant =
          transformer_file +
          ": without a model_index.json nothing says whether this is "
          "Z-Image-Turbo or the Z-Image base model (the weights are the same shape, and the file "
          "name does not say \"turbo\"); give --variant zimage-turbo or --variant zimage";
    }
  }

  std::vector<std::string> describe_pipeline(const ModelConfig& c) const override {
    return {"ZImagePipeline: the prompt's Qwen3 features, flow-matching Euler steps",
            c.is_distilled ? "Z-Image-Turbo: 8 steps without guidance by default"
                           : "Z-Image (base): 50 steps with classifier-free guidance 5 by default"};
  }
  std::string describe_transformer(const ModelConfig& c) const override {
    const TransformerConfig t = parse_transformer_config(c.family_transformer, "configuration");
    return std::to_string(t.n_refiner_layers) + " noise-refiner + " +
           std::to_string(t.n_refiner_layers) + " context-refiner + " + std::to_string(t.n_layers) +
           " main layers, width " + std::to_string(t.dim);
  }

  std::string precision_defaults() const override {
    return R"(# Z-Image. The embedders, and the pad tokens (rows copied into the stream).
transformer.all_x_embedder.*               >=bf16
transformer.cap_embedder.*                 >=bf16
transformer.t_embedder.*                   >=bf16
transformer.*_pad_token                    >=bf16
# Each block's modulation (adaLN_modulation, small) and the output layer.
transformer.*adaLN_modulation*             >=bf16
transformer.all_final_layer.*              >=bf16
# A control model stored beside it (convert --controlnet): its embedder and its blocks'
# modulation likewise; its blocks' projections take the type.
controlnet.control_all_x_embedder.*        >=bf16
controlnet.*adaLN_modulation*              >=bf16
)";
  }

  json diffusers_model_index(const ModelConfig&) const override {
    return {{"_class_name", "ZImagePipeline"},
            {"_diffusers_version", "0.36.0"},
            {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
            {"text_encoder", {"transformers", "Qwen3Model"}},
            {"tokenizer", {"transformers", "Qwen2Tokenizer"}},
            {"transformer", {"diffusers", "ZImageTransformer2DModel"}},
            {"vae", {"diffusers", "AutoencoderKL"}}};
  }
  std::string diffusers_transformer_class() const override { return "ZImageTransformer2DModel"; }

  bool reads_text_encoder(const TextEncoderConfig& e) const override { return e.qk_norm; }
  void check_pairing(const ModelConfig& c, const Files& f) const override {
    const TransformerConfig t = parse_transformer_config(c.family_transformer, f.transformer);
    check(t.cap_feat_dim == c.text_encoder.context_dim(), "the transformer (", f.transformer,
          ") reads text features ", t.cap_feat_dim, " wide, but the text encoder (", f.text_encoder,
          ") has hidden size ", c.text_encoder.hidden, ". Z-Image pairs with Qwen3-4B (2560).");
    check(!c.vae.latent_batch_norm && t.in_channels == c.vae.latent_channels, "the transformer (",
          f.transformer, ") works on latents of ", t.in_channels, " channels, but the VAE (", f.vae,
          ") has ", c.vae.latent_channels,
          c.vae.latent_batch_norm ? " and latent BatchNorm statistics (FLUX.2's VAE?)" : "",
          "; Z-Image uses the FLUX.1 VAE (16 channels)");
  }

 private:
  static TransformerConfig infer(const ShapeMap& t, const std::string& where) {
    TransformerConfig c;
    const Shape& pad = shape_of(t, "transformer.x_pad_token", where);
    const Shape& cap = shape_of(t, "transformer.cap_embedder.1.weight", where);
    check(pad.size() == 2 && cap.size() == 2, where,
          ": x_pad_token and cap_embedder.1.weight "
          "must be 2-D");
    c.dim = pad[1];
    c.cap_feat_dim = cap[1];
    c.n_layers = count_indexed(t, "transformer.layers.", where);
    c.n_refiner_layers = count_indexed(t, "transformer.noise_refiner.", where);
    const Shape& q = shape_of(t, "transformer.layers.0.attention.norm_q.weight", where);
    check(q.size() == 1 && q[0] > 0 && c.dim % q[0] == 0, where, ": width ", c.dim,
          " is not a multiple of the head width ", q.empty() ? 0 : q[0]);
    c.n_heads = c.dim / q[0];
    const std::string key = std::to_string(c.patch) + "-" + std::to_string(c.frame_patch);
    const Shape& x = shape_of(t, "transformer.all_x_embedder." + key + ".weight", where);
    check(x.size() == 2 && x[1] % (c.patch * c.patch * c.frame_patch) == 0, where,
          ": all_x_embedder has ", shape_str(x));
    c.in_channels = x[1] / (c.patch * c.patch * c.frame_patch);
    return c;
  }
};

}  // namespace

const ModelFamily& checkpoint() {
  static const ZImage family;
  return family;
}

}  // namespace klein::zimage
