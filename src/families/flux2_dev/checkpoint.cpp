#include "families/flux2_klein/checkpoint.h"
#include "families/flux2_dev/family.h"

namespace klein {

using json = nlohmann::json;

namespace {

// FLUX.2-dev: klein's transformer at 8 double + 48 single blocks of width 6144 with a guidance
// embedder (guidance-distilled: the scale goes to the model, no CFG pass), and the language
// model of Mistral-Small-3.1 (Mistral3ForConditionalGeneration) as text encoder, read at
// layers 10, 20 and 30. Its tensors are named as klein's; naming.h maps the Mistral3 prefixes.
class Flux2Dev final : public Flux2Klein {
 public:
  std::string_view id() const override { return "flux2-dev"; }
  std::string_view title() const override { return "FLUX.2-dev"; }
  std::vector<std::string> pipeline_classes() const override { return {"Flux2Pipeline"}; }
  // A transformer with a guidance embedder (diffusers or BFL spelling) is FLUX.2-dev's.
  bool recognises_transformer(const std::vector<NamedShape>& tensors) const override {
    for (const auto& t : tensors)
      if (t.name.find("guidance_in.") != std::string::npos ||
          t.name.find("time_guidance_embed.guidance_embedder.") != std::string::npos)
        return true;
    return false;
  }
  void read_transformer_config(const json& j, const ShapeMap* shapes, const std::string& f,
                               const std::string& weights_file, ModelConfig& c) const override {
    Flux2Klein::read_transformer_config(j, shapes, f, weights_file, c);
    // diffusers' default when the file does not say (FLUX.2-dev's config.json does not).
    if (!j.contains("guidance_embeds")) c.transformer.guidance_embeds = true;
    check(c.transformer.guidance_embeds, f,
          ": guidance_embeds is false, but a Flux2Pipeline "
          "(FLUX.2-dev) transformer embeds the guidance scale");
  }
  void infer_transformer_config(const ShapeMap& shapes, const std::string& where,
                                ModelConfig& c) const override {
    Flux2Klein::infer_transformer_config(shapes, where, c);
    c.transformer.guidance_embeds = true;
  }
  std::vector<int64_t> text_output_layers(int64_t) const override { return {10, 20, 30}; }
  void read_model_index(const json&, ModelConfig& c) const override {
    c.is_distilled = true;  // no unconditional pass: the guidance is embedded
    c.reference_cache = false;
  }
  std::vector<std::string> variant_names() const override { return {"dev"}; }
  std::string variants_help() const override {
    return "dev: FLUX.2-dev, 50 steps with the guidance embedded";
  }
  std::vector<PublishedModel> published_models() const override {
    return {{"dev",
             "FLUX.2-dev (32B, Mistral-Small-3.1 up to layer 30; with -t only, e.g. -t "
             "q4: about 30 GB; the tokenizer a Tekken tokenizer.json)"}};
  }
  // FLUX.2-dev (diffusers' scripts/convert_flux2_to_diffusers.py and the published configs):
  // 8 double and 48 single blocks, 48 heads of 128 (width 6144), a guidance embedder, context
  // 15360 = 3 x 5120 from layers 10, 20 and 30 of Mistral-Small-3.1's language model (40
  // layers, hidden 5120, MLP 32768, 32 query and 8 key/value heads of 128, no q/k norms,
  // vocabulary 131072, RoPE theta 1e9, RMSNorm eps 1e-5); klein's VAE.
  ModelConfig published_config(const std::string& name) const override {
    check(name == "dev", "FLUX.2-dev has no published model \"", name, "\"");
    ModelConfig c;
    c.family = "flux2-dev";
    c.transformer.num_double_blocks = 8;
    c.transformer.num_single_blocks = 48;
    c.transformer.num_heads = 48;
    c.transformer.context_dim = 15360;
    c.transformer.guidance_embeds = true;
    c.text_encoder.vocab_size = 131072;
    c.text_encoder.hidden = 5120;
    c.text_encoder.intermediate = 32768;
    c.text_encoder.num_layers = 40;
    c.text_encoder.num_heads = 32;
    c.text_encoder.num_kv_heads = 8;
    c.text_encoder.head_dim = 128;
    c.text_encoder.rms_eps = 1e-5;
    c.text_encoder.rope_theta = 1e9;
    c.text_encoder.qk_norm = false;
    c.text_encoder.output_layers = {10, 20, 30};
    return c;
  }
  std::string variant_name(const ModelConfig& c) const override {
    return c.transformer.inner_dim() == 6144 && c.text_encoder.hidden == 5120 ? "dev" : "";
  }
  void apply_variant(const std::string& name, bool, const std::string&,
                     ModelConfig& c) const override {
    check(name.empty() || name == "dev", "--variant ", name, ": a FLUX.2-dev model is \"dev\"");
    read_model_index(json::object(), c);
  }
  void decide_undeclared_variant(const std::string&, ModelConfig& c) const override {
    read_model_index(json::object(), c);
  }
  std::vector<std::string> describe_pipeline(const ModelConfig&) const override {
    return {
        "guidance-distilled: the guidance scale is given to the model, one pass per step "
        "(no classifier-free guidance)"};
  }
  json diffusers_model_index(const ModelConfig&) const override {
    return {{"_class_name", "Flux2Pipeline"},
            {"_diffusers_version", "0.36.0"},
            {"scheduler", {"diffusers", "FlowMatchEulerDiscreteScheduler"}},
            {"text_encoder", {"transformers", "Mistral3ForConditionalGeneration"}},
            {"tokenizer", {"transformers", "PixtralProcessor"}},
            {"transformer", {"diffusers", "Flux2Transformer2DModel"}},
            {"vae", {"diffusers", "AutoencoderKLFlux2"}}};
  }
  bool reads_text_encoder(const TextEncoderConfig& e) const override { return !e.qk_norm; }
  void check_pairing(const ModelConfig& c, const Files& f) const override {
    const auto& t = c.transformer;
    const auto& e = c.text_encoder;
    check(!e.qk_norm, "the text encoder (", f.text_encoder,
          ") is a Qwen3 model; FLUX.2-dev "
          "reads Mistral-Small-3.1's language model (Mistral3ForConditionalGeneration)");
    check(t.context_dim == e.context_dim(), "the transformer (", f.transformer,
          ") expects a text context ", t.context_dim, " wide, but the text encoder (",
          f.text_encoder, ", hidden size ", e.hidden, ") gives 3 x ", e.hidden, " = ",
          e.context_dim(), ". FLUX.2-dev pairs with Mistral-Small-3.1 (hidden 5120).");
    check_latents(c, f);
  }
};

}  // namespace

const ModelFamily& flux2_dev::checkpoint() {
  static const Flux2Dev dev;
  return dev;
}

}  // namespace klein
