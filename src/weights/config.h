#pragma once
// Typed hyper-parameters of the three networks and the scheduler, read from the
// checkpoint's config.json files (diffusers layout) or inferred from tensor shapes
// (single-file checkpoints), and cross-checked against the tensors.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace klein {

struct TransformerConfig {
  int64_t in_channels = 128;
  int64_t out_channels = 128;
  int64_t num_double_blocks = 5;       // "num_layers"
  int64_t num_single_blocks = 20;      // "num_single_layers"
  int64_t head_dim = 128;              // "attention_head_dim"
  int64_t num_heads = 24;              // "num_attention_heads"
  int64_t context_dim = 7680;          // "joint_attention_dim" = 3 x text hidden
  double mlp_ratio = 3.0;
  std::array<int64_t, 4> rope_axes = {32, 32, 32, 32};
  double rope_theta = 2000;
  double eps = 1e-6;
  int64_t timestep_channels = 256;     // "timestep_guidance_channels"
  bool guidance_embeds = false;

  int64_t inner_dim() const { return head_dim * num_heads; }
  int64_t mlp_hidden() const { return int64_t(double(inner_dim()) * mlp_ratio); }
};

struct TextEncoderConfig {
  int64_t vocab_size = 151936;
  int64_t hidden = 2560;               // "hidden_size"
  int64_t intermediate = 9728;         // "intermediate_size"
  int64_t num_layers = 36;             // "num_hidden_layers" in the checkpoint
  int64_t num_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;
  double rms_eps = 1e-6;
  double rope_theta = 1e6;
  // Qwen3 normalises q and k per head (RMSNorm, q_norm / k_norm) before RoPE; Mistral (the
  // language model of FLUX.2-dev's Mistral3 encoder, model_type "mistral") does not.
  bool qk_norm = true;
  // The pipeline reads the residual stream after these decoder layers (1-based, increasing)
  // and concatenates them per token; nothing after the last one is ever computed. FLUX.2-klein
  // reads three; Z-Image reads one, the output of the last layer but one.
  std::vector<int64_t> output_layers = {9, 18, 27};

  int64_t layers_needed() const { return output_layers.back(); }
  int64_t context_dim() const { return hidden * int64_t(output_layers.size()); }
};

struct VaeConfig {
  int64_t in_channels = 3;
  int64_t out_channels = 3;
  std::vector<int64_t> block_out_channels = {128, 256, 512, 512};
  std::vector<int64_t> decoder_block_out_channels;  // empty: same as the encoder's
  int64_t layers_per_block = 2;
  int64_t latent_channels = 32;
  int64_t norm_groups = 32;
  double norm_eps = 1e-6;              // GroupNorm eps of every norm in the VAE
  double batch_norm_eps = 1e-4;
  std::array<int64_t, 2> patch_size = {2, 2};
  bool use_quant_conv = true;
  bool use_post_quant_conv = true;
  bool mid_block_attention = true;
  // How the transformer's latents relate to the VAE's: FLUX.2's VAE keeps BatchNorm
  // statistics of the patchified latents (vae.bn.*); the FLUX.1 VAE that Z-Image uses has
  // none and scales instead: z = latents / scaling_factor + shift_factor before decoding.
  // Which one is the family's (ModelFamily::set_vae_latents); the factors are read from
  // config.json when it has them, else they are the family's.
  bool latent_batch_norm = true;
  double scaling_factor = 1.0;
  double shift_factor = 0.0;

  const std::vector<int64_t>& decoder_channels() const {
    return decoder_block_out_channels.empty() ? block_out_channels : decoder_block_out_channels;
  }
  // Channels of the patchified latent the transformer sees (32 x 2 x 2 = 128).
  int64_t packed_channels() const { return latent_channels * patch_size[0] * patch_size[1]; }
};

struct SchedulerConfig {
  int64_t num_train_timesteps = 1000;
  bool use_dynamic_shifting = true;
  double shift = 3.0;                  // used only without dynamic shifting
  std::string time_shift_type = "exponential";
};

struct ModelConfig {
  // The model family (weights/family.h): "flux2-klein" or "z-image". It decides how the
  // transformer's tensors are named and grouped and which pipeline runs the model.
  std::string family = "flux2-klein";
  TransformerConfig transformer;       // FLUX.2-klein's transformer
  // The transformer configuration of the other families, as their config.json has it
  // (checked when read); each family's code parses it into its own typed configuration.
  nlohmann::json family_transformer;
  TextEncoderConfig text_encoder;
  VaeConfig vae;
  SchedulerConfig scheduler;
  bool is_distilled = true;            // model_index.json; false means klein-base (CFG on)
  // Trained for the reference K/V cache (FLUX.2-klein-9b-kv; model_index.json's _class_name
  // Flux2KleinKVPipeline): references are cached keys and values, not tokens of every step.
  bool reference_cache = false;
  std::string name;                    // for metadata: directory or file name
  // Non-empty when nothing said whether the checkpoint is distilled, base or K/V (single files
  // without --variant or a BFL file name): why, for the error of whoever would run it.
  std::string undecided_variant;
};

// Parsers for the diffusers/transformers config.json files; `where` names the file in errors.
TransformerConfig parse_transformer_config(const nlohmann::json& j, const std::string& where);
// `output_layers`: the decoder layers the pipeline reads (TextEncoderConfig::output_layers);
// the file must have at least the last one.
TextEncoderConfig parse_text_encoder_config(const nlohmann::json& j, const std::string& where,
                                            const std::vector<int64_t>& output_layers = {9, 18,
                                                                                         27});
VaeConfig parse_vae_config(const nlohmann::json& j, const std::string& where);
SchedulerConfig parse_scheduler_config(const nlohmann::json& j, const std::string& where);

nlohmann::json to_json(const ModelConfig& c);
// The published variant a configuration is, in --variant's spelling ("4b", "4b-base", "9b",
// "9b-base", "9b-kv"; "4b-kv" for a 4B declared for the K/V pipeline), from the widths of the
// transformer (3072 / 4096) and the text encoder (2560 / 4096) and the pipeline flags; "" for
// other sizes (test models). docs/MODELS.md.
std::string variant_name(const ModelConfig& c);
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& where);
// num_hidden_layers of a text encoder's config.json (the class default when absent), checked,
// for choosing the layers the pipeline reads before the rest is parsed.
int64_t text_encoder_layers(const nlohmann::json& j, const std::string& where);

}  // namespace klein
