#pragma once
// FLUX.2-klein's checkpoints (weights/family.h): the transformer's names in every published
// spelling, shapes, configuration and LoRA modules (the klein naming of weights/naming.h,
// expected.h and config.h), its variants and pipeline classes. FLUX.2-dev's entry
// (families/flux2_dev) is this one with its own differences.
#include <algorithm>
#include <cctype>
#include <filesystem>

#include "core/error.h"
#include "core/json_fields.h"
#include "weights/family.h"

namespace klein {

// FLUX.2-klein (4B, 9B; distilled, base, K/V): the naming, shapes and configuration of
// naming.h, expected.h and config.h.
class Flux2Klein : public ModelFamily {
 public:
  using json = nlohmann::json;

  std::string_view id() const override { return "flux2-klein"; }
  std::string_view title() const override { return "FLUX.2-klein"; }
  std::vector<std::string> pipeline_classes() const override {
    return {"Flux2KleinPipeline", "Flux2KleinKVPipeline", "Flux2KleinImg2ImgPipeline",
            "Flux2KleinInpaintPipeline"};
  }
  bool recognises_transformer(const std::vector<NamedShape>&) const override {
    return true;  // the default: its mapping names whatever is not a klein tensor
  }

  Layout transformer_layout(const std::vector<NamedShape>& tensors) const override {
    return detect_layout(Component::Transformer, tensors);
  }
  std::vector<TensorSource> map_transformer(const std::vector<NamedShape>& tensors,
                                            const std::string& where) const override {
    return map_component(Component::Transformer, tensors, where);
  }
  std::optional<UnitOf> transformer_unit_of(const std::string& canonical) const override {
    return klein_transformer_unit_of(canonical);
  }
  ShapeMap expected_transformer(const ModelConfig& c) const override {
    return klein::expected_transformer(c.transformer);
  }
  std::vector<TensorSource> lora_targets(const std::string& module, const Shape& up,
                                         const std::string& where) const override {
    return klein_lora_targets(module, up, where);
  }

  void read_transformer_config(const json& j, const ShapeMap* shapes, const std::string& f,
                               const std::string& weights_file, ModelConfig& c) const override {
    c.transformer = parse_transformer_config(j, f);
    if (!shapes) return;
    const TransformerConfig b = klein::infer_transformer_config(*shapes, weights_file);
    const auto& a = c.transformer;
    check_config_matches_weights(f, "num_layers", a.num_double_blocks, b.num_double_blocks);
    check_config_matches_weights(f, "num_single_layers", a.num_single_blocks, b.num_single_blocks);
    check_config_matches_weights(f, "attention_head_dim", a.head_dim, b.head_dim);
    check_config_matches_weights(f, "num_attention_heads", a.num_heads, b.num_heads);
    check_config_matches_weights(f, "joint_attention_dim", a.context_dim, b.context_dim);
    check_config_matches_weights(f, "in_channels", a.in_channels, b.in_channels);
    check_config_matches_weights(f, "mlp_ratio (as MLP width)", a.mlp_hidden(), b.mlp_hidden());
  }
  void infer_transformer_config(const ShapeMap& shapes, const std::string& where,
                                ModelConfig& c) const override {
    c.transformer = klein::infer_transformer_config(shapes, where);
  }
  json transformer_config_json(const ModelConfig& c) const override {
    const auto& t = c.transformer;
    return {{"in_channels", t.in_channels},
            {"out_channels", t.out_channels},
            {"num_layers", t.num_double_blocks},
            {"num_single_layers", t.num_single_blocks},
            {"attention_head_dim", t.head_dim},
            {"num_attention_heads", t.num_heads},
            {"joint_attention_dim", t.context_dim},
            {"mlp_ratio", t.mlp_ratio},
            {"axes_dims_rope", t.rope_axes},
            {"rope_theta", t.rope_theta},
            {"eps", t.eps},
            {"timestep_guidance_channels", t.timestep_channels},
            {"guidance_embeds", t.guidance_embeds}};
  }

  std::vector<int64_t> text_output_layers(int64_t) const override { return {9, 18, 27}; }
  void set_vae_latents(VaeConfig& v, bool) const override { v.latent_batch_norm = true; }
  SchedulerConfig default_scheduler() const override { return {}; }

  void read_model_index(const json& index, ModelConfig& c) const override {
    if (index.contains("is_distilled") && index["is_distilled"].is_boolean())
      c.is_distilled = index["is_distilled"];
    if (index.contains("_class_name") && index["_class_name"].is_string())
      c.reference_cache = index["_class_name"] == "Flux2KleinKVPipeline";
  }

  std::vector<std::string> variant_names() const override {
    return {"4b", "4b-base", "9b", "9b-base", "9b-kv"};
  }
  std::vector<PublishedModel> published_models() const override;
  ModelConfig published_config(const std::string& name) const override;
  std::string variants_help() const override {
    return "4b, 9b: FLUX.2-klein distilled, 4 steps without guidance; 4b-base, 9b-base: 50 steps "
           "with CFG; 9b-kv: references' keys and values computed once";
  }
  std::string variant_name(const ModelConfig& c) const override {
    const int64_t width = c.transformer.inner_dim(), hidden = c.text_encoder.hidden;
    std::string size;
    if (width == 3072 && hidden == 2560) size = "4b";
    if (width == 4096 && hidden == 4096) size = "9b";
    if (size.empty()) return "";
    return size + (c.reference_cache ? "-kv" : c.is_distilled ? "" : "-base");
  }

  // Applies --variant: checks it against what the weights or files already decide (the
  // klein-4B's widths; a model_index.json's pipeline) and sets the rest.
  void apply_variant(const std::string& name, bool declared, const std::string& where,
                     ModelConfig& config) const override {
    if (name.empty()) return;
    const auto names = variant_names();
    check(std::find(names.begin(), names.end(), name) != names.end(), "--variant ", name,
          ": expected one of ", joined_variants());
    const bool distilled = name.find("-base") == std::string::npos;
    const bool reference_cache = name == "9b-kv";
    const bool nine_b = name.rfind("9b", 0) == 0;
    // klein-4B: inner width 3072 (24 heads x 128), Qwen3-4B text encoder (hidden 2560).
    const bool is_4b = config.transformer.inner_dim() == 3072 && config.text_encoder.hidden == 2560;
    check(!(nine_b && is_4b), "--variant ", name, ": ", where,
          " holds klein-4B weights "
          "(inner width 3072, text encoder hidden size 2560)");
    if (declared)
      check(config.is_distilled == distilled && config.reference_cache == reference_cache,
            "--variant ", name, ": ", where, " declares a ",
            config.reference_cache ? "K/V-cache"
            : config.is_distilled  ? "distilled"
                                   : "base",
            " model; --variant is for checkpoints that do not say");
    config.is_distilled = distilled;
    config.reference_cache = reference_cache;
  }

  // No model_index.json: distilled, base or K/V is not in the weights. BFL's file names say
  // it (flux-2-klein-4b, flux-2-klein-base-9b, ...; diffusers' conversion script reads them
  // the same way); anything else is left undecided for the caller to refuse.
  void decide_undeclared_variant(const std::string& transformer_file,
                                 ModelConfig& config) const override {
    std::string name = std::filesystem::path(transformer_file).filename().string();
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (name.find("klein") != std::string::npos) {
      config.is_distilled = name.find("base") == std::string::npos;
      config.reference_cache = name.find("kv") != std::string::npos;
    } else {
      config.undecided_variant =
          transformer_file +
          ": without a model_index.json nothing says whether this klein is "
          "distilled, base or the K/V-cache model (the weights are the same shape, and the file "
          "name is not one of BFL's, such as flux-2-klein-base-4b); give --variant " +
          joined_variants();
    }
  }

  std::vector<std::string> describe_pipeline(const ModelConfig& c) const override {
    std::vector<std::string> lines = {c.is_distilled ? "distilled: no classifier-free guidance"
                                                     : "base model: classifier-free guidance"};
    if (c.reference_cache)
      lines.push_back(
          "reference K/V cache: references computed once, their keys and values "
          "reused at every step (Flux2KleinKVPipeline)");
    return lines;
  }
  std::string describe_transformer(const ModelConfig& c) const override {
    const auto& t = c.transformer;
    return std::to_string(t.num_double_blocks) + " double + " +
           std::to_string(t.num_single_blocks) + " single blocks, inner width " +
           std::to_string(t.inner_dim());
  }

  std::string precision_defaults() const override {
    return R"(# FLUX.2-klein. The embedders: what every token's stream starts from.
transformer.x_embedder.*                   >=bf16
transformer.context_embedder.*             >=bf16
transformer.time_guidance_embed.*          >=bf16
# Shared modulation: scales and shifts of every block; output layer.
transformer.*_modulation*                  >=bf16
transformer.norm_out.*                     >=bf16
transformer.proj_out.*                     >=bf16
)";
  }

  json diffusers_model_index(const ModelConfig& c) const override {
    return {{"_class_name", c.reference_cache ? "Flux2KleinKVPipeline" : "Flux2KleinPipeline"},
            {"_diffusers_version", "0.36.0"},
            {"is_distilled", c.is_distilled},
            {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
            {"text_encoder", {"transformers", "Qwen3ForCausalLM"}},
            {"tokenizer", {"transformers", "Qwen2TokenizerFast"}},
            {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
            {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
  }
  std::string diffusers_transformer_class() const override { return "Flux2Transformer2DModel"; }

  bool reads_text_encoder(const TextEncoderConfig& e) const override { return e.qk_norm; }
  void check_pairing(const ModelConfig& c, const Files& f) const override {
    const auto& t = c.transformer;
    const auto& e = c.text_encoder;
    check(e.qk_norm, "the text encoder (", f.text_encoder,
          ") is a Mistral model; FLUX.2-klein "
          "reads a Qwen3 one (Qwen3-4B for klein-4B, Qwen3-8B for klein-9B)");
    check(t.context_dim == e.context_dim(), "the transformer (", f.transformer,
          ") expects a text context ", t.context_dim, " wide, but the text encoder (",
          f.text_encoder, ", hidden size ", e.hidden, ") gives 3 x ", e.hidden, " = ",
          e.context_dim(),
          ". FLUX.2-klein-4B pairs with Qwen3-4B (hidden 2560), klein-9B with "
          "Qwen3-8B (hidden 4096).");
    check_latents(c, f);
  }

 protected:
  // The transformer works on the VAE's packed latents.
  static void check_latents(const ModelConfig& c, const Files& f) {
    const auto& t = c.transformer;
    check(c.vae.latent_batch_norm && t.in_channels == c.vae.packed_channels(), "the transformer (",
          f.transformer, ") works on latents of ", t.in_channels, " channels, but the VAE (", f.vae,
          ") gives ", c.vae.latent_channels, " x 2 x 2 = ", c.vae.packed_channels(),
          c.vae.latent_batch_norm ? "" : " and has no latent BatchNorm statistics",
          " (a VAE of another model family?)");
    check(t.out_channels == t.in_channels, f.transformer, ": out_channels ", t.out_channels,
          " differs from in_channels ", t.in_channels);
  }

 private:
  std::string joined_variants() const {
    std::string list;
    for (const auto& n : variant_names()) list += (list.empty() ? "" : ", ") + n;
    return list;
  }
};

}  // namespace klein
