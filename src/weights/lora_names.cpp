// FLUX.2-klein's LoRA module names (ModelFamily::lora_targets): the diffusers/PEFT, BFL /
// ai-toolkit and kohya spellings, each mapped like the weight it changes (naming.h).
#include <cstring>
#include <map>
#include <regex>

#include "weights/naming.h"

namespace klein {

namespace {


// A kohya module ("lora_unet_double_blocks_0_img_attn_qkv") in the BFL spelling.
std::optional<std::string> kohya_to_bfl(const std::string& module) {
  static const std::map<std::string, std::string> block_tails = {
      {"img_attn_qkv", "img_attn.qkv"}, {"img_attn_proj", "img_attn.proj"},
      {"txt_attn_qkv", "txt_attn.qkv"}, {"txt_attn_proj", "txt_attn.proj"},
      {"img_mlp_0", "img_mlp.0"},       {"img_mlp_2", "img_mlp.2"},
      {"txt_mlp_0", "txt_mlp.0"},       {"txt_mlp_2", "txt_mlp.2"},
      {"linear1", "linear1"},           {"linear2", "linear2"},
  };
  static const std::map<std::string, std::string> shared = {
      {"img_in", "img_in"},
      {"txt_in", "txt_in"},
      {"time_in_in_layer", "time_in.in_layer"},
      {"time_in_out_layer", "time_in.out_layer"},
      {"final_layer_linear", "final_layer.linear"},
      {"final_layer_adaLN_modulation_1", "final_layer.adaLN_modulation.1"},
      {"double_stream_modulation_img_lin", "double_stream_modulation_img.lin"},
      {"double_stream_modulation_txt_lin", "double_stream_modulation_txt.lin"},
      {"single_stream_modulation_lin", "single_stream_modulation.lin"},
  };
  static const std::regex block(R"(^(double|single)_blocks_(\d+)_(.+)$)");
  const std::string rest = module.substr(strlen("lora_unet_"));
  std::smatch m;
  if (std::regex_match(rest, m, block)) {
    auto it = block_tails.find(m[3]);
    if (it == block_tails.end()) return std::nullopt;
    return m[1].str() + "_blocks." + m[2].str() + "." + it->second;
  }
  if (auto it = shared.find(rest); it != shared.end()) return it->second;
  return std::nullopt;
}

// The BFL spelling of transformer modules (after prefixes are stripped).
bool is_bfl_module(const std::string& m) {
  for (const char* p : {"double_blocks.", "single_blocks.", "img_in", "txt_in", "time_in.",
                        "final_layer.", "double_stream_modulation_img.lin",
                        "double_stream_modulation_txt.lin", "single_stream_modulation.lin"})
    if (m.starts_with(p)) return true;
  return false;
}

}  // namespace

std::vector<TensorSource> klein_lora_targets(const std::string& module, const Shape& up,
                                             const std::string& where) {
  std::string m = module;
  if (m.starts_with("lora_unet_")) {
    const auto bfl = kohya_to_bfl(m);
    if (!bfl) return {};
    m = *bfl;
  }
  for (const char* p : {"base_model.model.", "transformer.", "model.diffusion_model.",
                        "diffusion_model."})
    if (m.starts_with(p)) m = m.substr(strlen(p));
  const Layout layout = is_bfl_module(m) ? Layout::Bfl : Layout::Diffusers;
  return map_transformer_tensor({m + ".weight", up}, layout, where);
}

}  // namespace klein
