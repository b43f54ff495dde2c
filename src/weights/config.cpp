#include "weights/config.h"

#include <algorithm>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_fields.h"
#include "weights/family.h"

namespace klein {

using json = nlohmann::json;

namespace {

template <class T>
void read(const json& j, const char* key, T& out, const std::string& where) {
  read_json_field(j, key, out, where);
}

void require_object(const json& j, const std::string& where) {
  check(j.is_object(), where, ": expected a JSON object");
}

void check_positive(int64_t v, const char* key, const std::string& where) {
  check(v > 0, where, ": \"", key, "\" must be positive, got ", v);
}

}  // namespace

TransformerConfig parse_transformer_config(const json& j, const std::string& where) {
  require_object(j, where);
  TransformerConfig c;
  read(j, "in_channels", c.in_channels, where);
  c.out_channels = c.in_channels;
  read(j, "out_channels", c.out_channels, where);
  read(j, "num_layers", c.num_double_blocks, where);
  read(j, "num_single_layers", c.num_single_blocks, where);
  read(j, "attention_head_dim", c.head_dim, where);
  read(j, "num_attention_heads", c.num_heads, where);
  read(j, "joint_attention_dim", c.context_dim, where);
  read(j, "mlp_ratio", c.mlp_ratio, where);
  std::vector<int64_t> axes(c.rope_axes.begin(), c.rope_axes.end());
  read(j, "axes_dims_rope", axes, where);
  check(axes.size() == 4, where, ": axes_dims_rope must have 4 entries, got ", axes.size());
  std::copy(axes.begin(), axes.end(), c.rope_axes.begin());
  read(j, "rope_theta", c.rope_theta, where);
  read(j, "eps", c.eps, where);
  read(j, "timestep_guidance_channels", c.timestep_channels, where);
  read(j, "guidance_embeds", c.guidance_embeds, where);
  int64_t patch = 1;
  read(j, "patch_size", patch, where);
  check(patch == 1, where, ": patch_size ", patch, " is not supported (FLUX.2 uses 1)");
  check_positive(c.num_heads, "num_attention_heads", where);
  check_positive(c.head_dim, "attention_head_dim", where);
  check(axes[0] + axes[1] + axes[2] + axes[3] == c.head_dim, where,
        ": axes_dims_rope must sum to attention_head_dim ", c.head_dim);
  return c;
}

TextEncoderConfig parse_text_encoder_config(const json& j, const std::string& where,
                                            const std::vector<int64_t>& output_layers) {
  require_object(j, where);
  TextEncoderConfig c;
  c.output_layers = output_layers;
  std::string model_type;
  read(j, "model_type", model_type, where);
  // Mistral3ForConditionalGeneration (FLUX.2-dev) nests its language model's configuration.
  if (model_type == "mistral3") {
    check(j.contains("text_config") && j["text_config"].is_object(), where,
          ": a mistral3 configuration without a text_config object");
    TextEncoderConfig inner = parse_text_encoder_config(
        j["text_config"], where + " (text_config)", output_layers);
    check(!inner.qk_norm, where, ": the text_config of a mistral3 model is not a Mistral one");
    return inner;
  }
  check(model_type.empty() || model_type == "qwen3" || model_type == "mistral", where,
        ": model_type \"", model_type, "\" is not a text encoder this engine runs (qwen3 for "
        "FLUX.2-klein and Z-Image, mistral3 for FLUX.2-dev)");
  c.qk_norm = model_type != "mistral";
  read(j, "vocab_size", c.vocab_size, where);
  read(j, "hidden_size", c.hidden, where);
  read(j, "intermediate_size", c.intermediate, where);
  read(j, "num_hidden_layers", c.num_layers, where);
  read(j, "num_attention_heads", c.num_heads, where);
  read(j, "num_key_value_heads", c.num_kv_heads, where);
  c.head_dim = c.hidden / std::max<int64_t>(1, c.num_heads);
  read(j, "head_dim", c.head_dim, where);
  read(j, "rms_norm_eps", c.rms_eps, where);
  read(j, "rope_theta", c.rope_theta, where);
  check_positive(c.num_heads, "num_attention_heads", where);
  check_positive(c.num_kv_heads, "num_key_value_heads", where);
  check(c.num_heads % c.num_kv_heads == 0, where, ": num_attention_heads ", c.num_heads,
        " is not a multiple of num_key_value_heads ", c.num_kv_heads);
  check(c.num_layers >= c.layers_needed(), where, ": num_hidden_layers ", c.num_layers,
        " but the pipeline reads the output of layer ", c.layers_needed());
  return c;
}

VaeConfig parse_vae_config(const json& j, const std::string& where) {
  require_object(j, where);
  VaeConfig c;
  read(j, "in_channels", c.in_channels, where);
  read(j, "out_channels", c.out_channels, where);
  read(j, "block_out_channels", c.block_out_channels, where);
  read(j, "decoder_block_out_channels", c.decoder_block_out_channels, where);
  read(j, "layers_per_block", c.layers_per_block, where);
  read(j, "latent_channels", c.latent_channels, where);
  read(j, "norm_num_groups", c.norm_groups, where);
  read(j, "batch_norm_eps", c.batch_norm_eps, where);
  std::vector<int64_t> patch = {2, 2};
  read(j, "patch_size", patch, where);
  check(patch.size() == 2, where, ": patch_size must have 2 entries");
  c.patch_size = {patch[0], patch[1]};
  read(j, "use_quant_conv", c.use_quant_conv, where);
  read(j, "use_post_quant_conv", c.use_post_quant_conv, where);
  read(j, "mid_block_add_attention", c.mid_block_attention, where);
  read(j, "scaling_factor", c.scaling_factor, where);
  read(j, "shift_factor", c.shift_factor, where);
  check(c.scaling_factor != 0.0, where, ": scaling_factor must not be 0");
  std::string act = "silu";
  read(j, "act_fn", act, where);
  check(act == "silu", where, ": act_fn \"", act, "\" is not supported (expected silu)");
  check(!c.block_out_channels.empty(), where, ": block_out_channels is empty");
  for (int64_t ch : c.block_out_channels)
    check(ch > 0 && ch % c.norm_groups == 0, where, ": block_out_channels entry ", ch,
          " is not a positive multiple of norm_num_groups ", c.norm_groups);
  return c;
}

SchedulerConfig parse_scheduler_config(const json& j, const std::string& where) {
  require_object(j, where);
  SchedulerConfig c;
  read(j, "num_train_timesteps", c.num_train_timesteps, where);
  read(j, "use_dynamic_shifting", c.use_dynamic_shifting, where);
  read(j, "shift", c.shift, where);
  read(j, "time_shift_type", c.time_shift_type, where);
  check(c.time_shift_type == "exponential" || c.time_shift_type == "linear", where,
        ": time_shift_type \"", c.time_shift_type, "\" is not supported");
  return c;
}

std::string variant_name(const ModelConfig& c) { return model_family(c).variant_name(c); }

json to_json(const ModelConfig& c) {
  const auto& e = c.text_encoder;
  const auto& v = c.vae;
  return json{
      {"family", c.family},
      {"name", c.name},
      {"variant", variant_name(c)},  // derived (not read back): what --variant would say
      {"is_distilled", c.is_distilled},
      {"reference_cache", c.reference_cache},
      {"transformer", model_family(c).transformer_config_json(c)},
      {"text_encoder",
       {{"model_type", e.qk_norm ? "qwen3" : "mistral"}, {"vocab_size", e.vocab_size}, {"hidden_size", e.hidden},
        {"intermediate_size", e.intermediate}, {"num_hidden_layers", e.num_layers},
        {"num_attention_heads", e.num_heads}, {"num_key_value_heads", e.num_kv_heads},
        {"head_dim", e.head_dim}, {"rms_norm_eps", e.rms_eps}, {"rope_theta", e.rope_theta}}},
      {"vae",
       {{"in_channels", v.in_channels}, {"out_channels", v.out_channels},
        {"block_out_channels", v.block_out_channels},
        {"decoder_block_out_channels", v.decoder_block_out_channels.empty()
                                           ? json(nullptr)
                                           : json(v.decoder_block_out_channels)},
        {"layers_per_block", v.layers_per_block}, {"latent_channels", v.latent_channels},
        {"norm_num_groups", v.norm_groups}, {"batch_norm_eps", v.batch_norm_eps},
        {"patch_size", v.patch_size}, {"use_quant_conv", v.use_quant_conv},
        {"use_post_quant_conv", v.use_post_quant_conv},
        {"mid_block_add_attention", v.mid_block_attention}, {"act_fn", "silu"},
        {"scaling_factor", v.scaling_factor},
        {"shift_factor", v.shift_factor}}},
      {"scheduler",
       {{"num_train_timesteps", c.scheduler.num_train_timesteps},
        {"use_dynamic_shifting", c.scheduler.use_dynamic_shifting},
        {"shift", c.scheduler.shift}, {"time_shift_type", c.scheduler.time_shift_type}}},
  };
}

ModelConfig model_config_from_json(const json& j, const std::string& where) {
  require_object(j, where);
  ModelConfig c;
  read(j, "family", c.family, where);  // absent in containers from before Z-Image: klein
  const ModelFamily& family = model_family(c.family, where);
  read(j, "name", c.name, where);
  read(j, "is_distilled", c.is_distilled, where);
  read(j, "reference_cache", c.reference_cache, where);  // absent in older containers
  check(j.contains("transformer") && j.contains("text_encoder") && j.contains("vae") &&
            j.contains("scheduler"),
        where, ": model configuration lacks one of transformer, text_encoder, vae, scheduler");
  family.read_transformer_config(j["transformer"], nullptr, where + " (transformer)", where, c);
  c.text_encoder = parse_text_encoder_config(
      j["text_encoder"], where + " (text_encoder)",
      family.text_output_layers(text_encoder_layers(j["text_encoder"], where + " (text_encoder)")));
  c.vae = parse_vae_config(j["vae"], where + " (vae)");
  family.set_vae_latents(c.vae, true);
  c.scheduler = parse_scheduler_config(j["scheduler"], where + " (scheduler)");
  return c;
}

int64_t text_encoder_layers(const json& j, const std::string& where) {
  if (j.is_object() && j.value("model_type", "") == "mistral3" && j.contains("text_config"))
    return text_encoder_layers(j["text_config"], where + " (text_config)");
  TextEncoderConfig defaults;
  int64_t n = defaults.num_layers;
  read(j, "num_hidden_layers", n, where);
  check(n > 0, where, ": num_hidden_layers must be positive, got ", n);
  return n;
}

}  // namespace klein
