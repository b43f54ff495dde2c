#pragma once
// The Z-Image transformer's hyper-parameters (diffusers ZImageTransformer2DModel's
// config.json). Defaults are Z-Image-Turbo's.
#include <array>
#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace klein::zimage {

struct TransformerConfig {
  int64_t in_channels = 16;  // latent channels (out_channels is the same)
  int64_t patch = 2;         // all_patch_size: [2]
  int64_t frame_patch = 1;   // all_f_patch_size: [1]
  int64_t dim = 3840;
  int64_t n_layers = 30;         // main layers
  int64_t n_refiner_layers = 2;  // noise-refiner and context-refiner blocks each
  int64_t n_heads = 30;
  double norm_eps = 1e-5;  // every RMSNorm of the blocks and of the caption embedder
  double rope_theta = 256.0;
  double t_scale = 1000.0;  // the model time t in [0, 1] is multiplied by this
  std::array<int64_t, 3> axes_dims = {32, 48, 48};      // RoPE widths of (t, h, w)
  std::array<int64_t, 3> axes_lens = {1536, 512, 512};  // positions must stay below these
  int64_t cap_feat_dim = 2560;                          // text-encoder hidden size

  int64_t head_dim() const { return dim / n_heads; }
  // FeedForward hidden width: Python's int(dim / 3 * 8).
  int64_t ffn_hidden() const { return int64_t(double(dim) / 3.0 * 8.0); }
  // Width of the timestep embedding that drives every modulation: min(dim, 256).
  int64_t adaln_dim() const { return dim < 256 ? dim : 256; }
  // Features of one patch token: frame_patch · patch² · channels (64).
  int64_t patch_features() const { return frame_patch * patch * patch * in_channels; }
};

// Reads config.json; `where` names the file in errors. Settings this implementation does not
// run (another patch size, no q/k norm, the Omni variant's SigLIP branch, head widths that do
// not match the RoPE axes) are refused with the setting's name.
TransformerConfig parse_transformer_config(const nlohmann::json& j, const std::string& where);
// The configuration as config.json spells it (parse_transformer_config reads it back).
nlohmann::json to_json(const TransformerConfig& c);

}  // namespace klein::zimage
