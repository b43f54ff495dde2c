#include "weights/naming.h"

#include <map>
#include <regex>

#include "core/error.h"

namespace klein {

namespace {


// "a.b.7.rest" with prefix "a.b." -> index 7 and rest "rest".
bool split_index(const std::string& name, const std::string& prefix, int64_t& index,
                 std::string& rest) {
  if (!name.starts_with(prefix)) return false;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  const std::string num = name.substr(prefix.size(), dot - prefix.size());
  if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoll(num);
  rest = name.substr(dot + 1);
  return true;
}

std::string strip_known_prefixes(std::string name) {
  for (const char* p : {"model.diffusion_model.", "diffusion_model.", "text_encoders.qwen3_4b.",
                        "first_stage_model.", "vae."}) {
    if (name.starts_with(p)) return name.substr(std::string(p).size());
  }
  return name;
}

// --- transformer ---------------------------------------------------------------------------

bool is_bfl_transformer(const std::vector<NamedShape>& t) {
  for (const auto& x : t) {
    const std::string n = strip_known_prefixes(x.name);
    if (n.starts_with("double_blocks.") || n.starts_with("img_in.")) return true;
  }
  return false;
}

// BFL -> diffusers renames that are one-to-one.
std::optional<std::string> bfl_transformer_rename(const std::string& n) {
  static const std::map<std::string, std::string> shared = {
      {"img_in.weight", "x_embedder.weight"},
      {"txt_in.weight", "context_embedder.weight"},
      {"time_in.in_layer.weight", "time_guidance_embed.timestep_embedder.linear_1.weight"},
      {"time_in.out_layer.weight", "time_guidance_embed.timestep_embedder.linear_2.weight"},
      {"guidance_in.in_layer.weight", "time_guidance_embed.guidance_embedder.linear_1.weight"},
      {"guidance_in.out_layer.weight", "time_guidance_embed.guidance_embedder.linear_2.weight"},
      {"double_stream_modulation_img.lin.weight", "double_stream_modulation_img.linear.weight"},
      {"double_stream_modulation_txt.lin.weight", "double_stream_modulation_txt.linear.weight"},
      {"single_stream_modulation.lin.weight", "single_stream_modulation.linear.weight"},
      {"final_layer.linear.weight", "proj_out.weight"},
  };
  if (auto it = shared.find(n); it != shared.end()) return it->second;
  static const std::map<std::string, std::string> dbl = {
      {"img_attn.norm.query_norm.scale", "attn.norm_q.weight"},
      {"img_attn.norm.key_norm.scale", "attn.norm_k.weight"},
      {"txt_attn.norm.query_norm.scale", "attn.norm_added_q.weight"},
      {"txt_attn.norm.key_norm.scale", "attn.norm_added_k.weight"},
      {"img_attn.proj.weight", "attn.to_out.0.weight"},
      {"txt_attn.proj.weight", "attn.to_add_out.weight"},
      {"img_mlp.0.weight", "ff.linear_in.weight"},
      {"img_mlp.2.weight", "ff.linear_out.weight"},
      {"txt_mlp.0.weight", "ff_context.linear_in.weight"},
      {"txt_mlp.2.weight", "ff_context.linear_out.weight"},
  };
  static const std::map<std::string, std::string> sgl = {
      {"linear1.weight", "attn.to_qkv_mlp_proj.weight"},
      {"linear2.weight", "attn.to_out.weight"},
      {"norm.query_norm.scale", "attn.norm_q.weight"},
      {"norm.key_norm.scale", "attn.norm_k.weight"},
  };
  int64_t i;
  std::string rest;
  auto with_weight_spelling = [](std::string r) {
    // Some repacks spell the RMSNorm scale ".weight".
    const std::string w = ".weight";
    if (r.size() > w.size() && r.compare(r.size() - w.size(), w.size(), w) == 0 &&
        r.find("_norm.") != std::string::npos)
      r = r.substr(0, r.size() - w.size()) + ".scale";
    return r;
  };
  if (split_index(n, "double_blocks.", i, rest)) {
    if (auto it = dbl.find(with_weight_spelling(rest)); it != dbl.end())
      return "transformer_blocks." + std::to_string(i) + "." + it->second;
  }
  if (split_index(n, "single_blocks.", i, rest)) {
    if (auto it = sgl.find(with_weight_spelling(rest)); it != sgl.end())
      return "single_transformer_blocks." + std::to_string(i) + "." + it->second;
  }
  return std::nullopt;
}

// One transformer tensor to its canonical tensor(s): renamed, or split (the BFL fused QKV).
std::vector<TensorSource> map_one_transformer(const NamedShape& t, bool bfl,
                                              const std::string& where) {
  const std::string n = strip_known_prefixes(t.name);
  if (!bfl) return {{"transformer." + n, t.name}};
  int64_t i;
  std::string rest;
  if (split_index(n, "double_blocks.", i, rest) &&
      (rest == "img_attn.qkv.weight" || rest == "txt_attn.qkv.weight")) {
    check(t.shape.size() == 2 && t.shape[0] % 3 == 0, where, ": tensor ", t.name,
          " should be a fused [3*inner, inner] projection, got ", shape_str(t.shape));
    const int64_t d = t.shape[0] / 3;
    const std::string block = "transformer.transformer_blocks." + std::to_string(i) + ".attn.";
    const bool img = rest[0] == 'i';
    const char* names[3] = {img ? "to_q" : "add_q_proj", img ? "to_k" : "add_k_proj",
                            img ? "to_v" : "add_v_proj"};
    std::vector<TensorSource> out;
    for (int part = 0; part < 3; ++part)
      out.push_back({block + names[part] + ".weight", t.name, part * d, (part + 1) * d});
    return out;
  }
  if (n == "final_layer.adaLN_modulation.1.weight") {
    TensorSource s{"transformer.norm_out.linear.weight", t.name};
    s.swap_halves = true;
    return {s};
  }
  auto renamed = bfl_transformer_rename(n);
  if (!renamed) fail(where, ": unknown transformer tensor ", t.name);
  return {{"transformer." + *renamed, t.name}};
}

std::vector<TensorSource> map_transformer(const std::vector<NamedShape>& tensors,
                                          const std::string& where) {
  std::vector<TensorSource> out;
  const bool bfl = is_bfl_transformer(tensors);
  for (const auto& t : tensors)
    for (TensorSource& s : map_one_transformer(t, bfl, where)) out.push_back(std::move(s));
  return out;
}

// --- text encoder ---------------------------------------------------------------------------

std::vector<TensorSource> map_text_encoder(const std::vector<NamedShape>& tensors,
                                           const std::string& where) {
  std::vector<TensorSource> out;
  for (const auto& t : tensors) {
    std::string n = strip_known_prefixes(t.name);
    // Mistral3ForConditionalGeneration (FLUX.2-dev) holds its language model under
    // "language_model." (older transformers: language_model.model.*, language_model.lm_head.*;
    // newer: model.language_model.*, lm_head.*), beside a vision tower and a projector that
    // image generation never reads (they map to names without a unit: dropped, and recorded).
    // Single-file repacks may put the language model under "text_encoder." or under
    // "language_model." without its "model." (the spellings InvokeAI's loader accepts).
    if (n.starts_with("text_encoder.")) n = n.substr(std::string("text_encoder.").size());
    if (n.starts_with("language_model.model.")) n = n.substr(std::string("language_model.").size());
    else if (n.starts_with("language_model.lm_head.")) n = n.substr(std::string("language_model.").size());
    else if (n.starts_with("language_model.")) n = "model." + n.substr(std::string("language_model.").size());
    else if (n.starts_with("model.language_model.")) n = "model." + n.substr(std::string("model.language_model.").size());
    else if (n.starts_with("model.vision_tower.") || n.starts_with("model.multi_modal_projector."))
      n = n.substr(std::string("model.").size());
    if (n.starts_with("vision_tower.") || n.starts_with("multi_modal_projector.")) {
      out.push_back({"text_encoder." + n, t.name});
      continue;
    }
    if (n.starts_with("lm_head.")) {
      out.push_back({"text_encoder." + n, t.name});
      continue;
    }
    // Some single-file exports drop the leading "model.".
    if (!n.starts_with("model.")) n = "model." + n;
    out.push_back({"text_encoder." + n, t.name});
  }
  return out;
}

// --- VAE --------------------------------------------------------------------------------

bool is_bfl_vae(const std::vector<NamedShape>& t) {
  for (const auto& x : t) {
    const std::string n = strip_known_prefixes(x.name);
    if (n.starts_with("encoder.down.") || n.starts_with("decoder.up.") ||
        n.starts_with("encoder.mid.") || n.starts_with("decoder.mid."))
      return true;
  }
  return false;
}

// The BFL (original autoencoder) spelling of every VAE tensor, to diffusers.
std::optional<std::string> bfl_vae_rename(const std::string& n, bool& squeeze) {
  static const std::vector<std::pair<std::regex, std::string>> rules = [] {
    std::vector<std::pair<std::regex, std::string>> r;
    auto add = [&](const char* re, const char* to) { r.emplace_back(std::regex(re), to); };
    add(R"(^(encoder|decoder)\.(conv_in|conv_out)\.(weight|bias)$)", "$1.$2.$3");
    add(R"(^(encoder|decoder)\.norm_out\.(weight|bias)$)", "$1.conv_norm_out.$2");
    add(R"(^encoder\.down\.(\d+)\.block\.(\d+)\.nin_shortcut\.(weight|bias)$)",
        "encoder.down_blocks.$1.resnets.$2.conv_shortcut.$3");
    add(R"(^encoder\.down\.(\d+)\.block\.(\d+)\.(norm1|norm2|conv1|conv2)\.(weight|bias)$)",
        "encoder.down_blocks.$1.resnets.$2.$3.$4");
    add(R"(^encoder\.down\.(\d+)\.downsample\.conv\.(weight|bias)$)",
        "encoder.down_blocks.$1.downsamplers.0.conv.$2");
    add(R"(^(encoder|decoder)\.mid\.block_1\.nin_shortcut\.(weight|bias)$)",
        "$1.mid_block.resnets.0.conv_shortcut.$2");
    add(R"(^(encoder|decoder)\.mid\.block_1\.(norm1|norm2|conv1|conv2)\.(weight|bias)$)",
        "$1.mid_block.resnets.0.$2.$3");
    add(R"(^(encoder|decoder)\.mid\.block_2\.(norm1|norm2|conv1|conv2)\.(weight|bias)$)",
        "$1.mid_block.resnets.1.$2.$3");
    add(R"(^(encoder|decoder)\.mid\.attn_1\.norm\.(weight|bias)$)",
        "$1.mid_block.attentions.0.group_norm.$2");
    add(R"(^(encoder|decoder)\.mid\.attn_1\.(q|k|v)\.(weight|bias)$)",
        "$1.mid_block.attentions.0.to_$2.$3");
    add(R"(^(encoder|decoder)\.mid\.attn_1\.proj_out\.(weight|bias)$)",
        "$1.mid_block.attentions.0.to_out.0.$2");
    add(R"(^encoder\.quant_conv\.(weight|bias)$)", "quant_conv.$1");
    add(R"(^quant_conv\.(weight|bias)$)", "quant_conv.$1");
    add(R"(^decoder\.post_quant_conv\.(weight|bias)$)", "post_quant_conv.$1");
    add(R"(^post_quant_conv\.(weight|bias)$)", "post_quant_conv.$1");
    add(R"(^bn\.(running_mean|running_var|num_batches_tracked)$)", "bn.$1");
    return r;
  }();
  std::smatch m;
  // Decoder levels are numbered the other way round in the BFL file.
  static const std::regex up(
      R"(^decoder\.up\.(\d+)\.(block\.(\d+)\.(norm1|norm2|conv1|conv2|nin_shortcut)|upsample\.conv)\.(weight|bias)$)");
  if (std::regex_match(n, m, up)) {
    const int level = 3 - std::stoi(m[1]);
    if (level < 0) return std::nullopt;
    const std::string base = "decoder.up_blocks." + std::to_string(level) + ".";
    if (m[2].str().rfind("upsample", 0) == 0) return base + "upsamplers.0.conv." + m[5].str();
    std::string part = m[4];
    if (part == "nin_shortcut") part = "conv_shortcut";
    return base + "resnets." + m[3].str() + "." + part + "." + m[5].str();
  }
  for (const auto& [re, to] : rules) {
    if (std::regex_match(n, m, re)) {
      squeeze = n.find(".attn_1.") != std::string::npos && n.ends_with(".weight") &&
                n.find(".norm.") == std::string::npos;
      return m.format(to);
    }
  }
  return std::nullopt;
}

std::vector<TensorSource> map_vae(const std::vector<NamedShape>& tensors, const std::string& where) {
  std::vector<TensorSource> out;
  const bool bfl = is_bfl_vae(tensors);
  for (const auto& t : tensors) {
    const std::string n = strip_known_prefixes(t.name);
    if (!bfl) {
      out.push_back({"vae." + n, t.name});
      continue;
    }
    bool squeeze = false;
    auto renamed = bfl_vae_rename(n, squeeze);
    if (!renamed) fail(where, ": unknown VAE tensor ", t.name);
    TensorSource s{"vae." + *renamed, t.name};
    s.squeeze_1x1 = squeeze && t.shape.size() == 4;
    out.push_back(s);
  }
  return out;
}

}  // namespace

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::Bfl: return "BFL";
    case Layout::Original: return "original";
    case Layout::Diffusers: break;
  }
  return "diffusers";
}

Layout detect_layout(Component c, const std::vector<NamedShape>& tensors) {
  switch (c) {
    case Component::Transformer: return is_bfl_transformer(tensors) ? Layout::Bfl : Layout::Diffusers;
    case Component::Vae: return is_bfl_vae(tensors) ? Layout::Bfl : Layout::Diffusers;
    case Component::TextEncoder: return Layout::Diffusers;  // BFL and ComfyUI use the HF names
  }
  return Layout::Diffusers;
}

Shape canonical_shape(const TensorSource& t, const Shape& source_shape) {
  Shape s = source_shape;
  if (t.row_end >= 0) s[0] = t.row_end - t.row_begin;
  if (t.squeeze_1x1 && s.size() == 4) s = {s[0], s[1]};
  return s;
}

const char* component_name(Component c) {
  switch (c) {
    case Component::Transformer: return "transformer";
    case Component::TextEncoder: return "text encoder";
    case Component::Vae: return "VAE";
  }
  return "?";
}

std::vector<TensorSource> map_transformer_tensor(const NamedShape& tensor, Layout layout,
                                                const std::string& where) {
  return map_one_transformer(tensor, layout == Layout::Bfl, where);
}

std::vector<TensorSource> map_component(Component c, const std::vector<NamedShape>& tensors,
                                        const std::string& where) {
  switch (c) {
    case Component::Transformer: return map_transformer(tensors, where);
    case Component::TextEncoder: return map_text_encoder(tensors, where);
    case Component::Vae: return map_vae(tensors, where);
  }
  return {};
}

std::optional<UnitOf> component_unit_of(const std::string& name) {
  int64_t i;
  std::string rest;
  if (split_index(name, "text_encoder.model.layers.", i, rest))
    return UnitOf{"text_encoder.layer." + std::to_string(i),
                  "text_encoder.model.layers." + std::to_string(i) + "."};
  if (name == "text_encoder.model.embed_tokens.weight")
    return UnitOf{"text_encoder.embed", "text_encoder.model."};
  if (name == "text_encoder.model.norm.weight")
    return UnitOf{"text_encoder.norm", "text_encoder.model."};
  if (name == "text_encoder.lm_head.weight")  // untied (Qwen3-8B); prompt upsampling reads it
    return UnitOf{"text_encoder.lm_head", "text_encoder."};
  if (name.starts_with("vae.encoder.") || name.starts_with("vae.quant_conv."))
    return UnitOf{"vae.encoder", "vae."};
  if (name.starts_with("vae.decoder.") || name.starts_with("vae.post_quant_conv."))
    return UnitOf{"vae.decoder", "vae."};
  if (name == "vae.bn.running_mean" || name == "vae.bn.running_var")
    return UnitOf{"vae.latent_stats", "vae."};
  return std::nullopt;
}

std::optional<UnitOf> klein_transformer_unit_of(const std::string& name) {
  int64_t i;
  std::string rest;
  if (split_index(name, "transformer.transformer_blocks.", i, rest))
    return UnitOf{"transformer.double." + std::to_string(i),
                  "transformer.transformer_blocks." + std::to_string(i) + "."};
  if (split_index(name, "transformer.single_transformer_blocks.", i, rest))
    return UnitOf{"transformer.single." + std::to_string(i),
                  "transformer.single_transformer_blocks." + std::to_string(i) + "."};
  if (name.starts_with("transformer.")) return UnitOf{"transformer.shared", "transformer."};
  return std::nullopt;
}

std::optional<UnitOf> unit_of(const std::string& name) {
  if (name.starts_with("transformer.")) return klein_transformer_unit_of(name);
  return component_unit_of(name);
}

}  // namespace klein
