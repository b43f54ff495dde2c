#include "weights/expected.h"

#include <set>

#include "core/error.h"

namespace klein {

namespace {

std::string idx(int64_t i) { return std::to_string(i); }

const Shape& shape_of(const ShapeMap& m, const std::string& name, const std::string& where) {
  auto it = m.find(name);
  if (it == m.end()) fail(where, ": missing tensor ", name);
  return it->second;
}

}  // namespace

ShapeMap expected_transformer(const TransformerConfig& c) {
  const int64_t D = c.inner_dim(), F = c.mlp_hidden(), H = c.head_dim;
  const std::string t = "transformer.";
  ShapeMap m;
  m[t + "x_embedder.weight"] = {D, c.in_channels};
  m[t + "context_embedder.weight"] = {D, c.context_dim};
  m[t + "time_guidance_embed.timestep_embedder.linear_1.weight"] = {D, c.timestep_channels};
  m[t + "time_guidance_embed.timestep_embedder.linear_2.weight"] = {D, D};
  if (c.guidance_embeds) {  // FLUX.2-dev
    m[t + "time_guidance_embed.guidance_embedder.linear_1.weight"] = {D, c.timestep_channels};
    m[t + "time_guidance_embed.guidance_embedder.linear_2.weight"] = {D, D};
  }
  m[t + "double_stream_modulation_img.linear.weight"] = {6 * D, D};
  m[t + "double_stream_modulation_txt.linear.weight"] = {6 * D, D};
  m[t + "single_stream_modulation.linear.weight"] = {3 * D, D};
  m[t + "norm_out.linear.weight"] = {2 * D, D};
  m[t + "proj_out.weight"] = {c.out_channels, D};
  for (int64_t b = 0; b < c.num_double_blocks; ++b) {
    const std::string p = t + "transformer_blocks." + idx(b) + ".";
    for (const char* n : {"to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj",
                          "to_add_out"})
      m[p + "attn." + n + ".weight"] = {D, D};
    m[p + "attn.to_out.0.weight"] = {D, D};
    for (const char* n : {"norm_q", "norm_k", "norm_added_q", "norm_added_k"})
      m[p + "attn." + n + ".weight"] = {H};
    for (const char* ff : {"ff", "ff_context"}) {
      m[p + ff + ".linear_in.weight"] = {2 * F, D};
      m[p + ff + ".linear_out.weight"] = {D, F};
    }
  }
  for (int64_t b = 0; b < c.num_single_blocks; ++b) {
    const std::string p = t + "single_transformer_blocks." + idx(b) + ".attn.";
    m[p + "to_qkv_mlp_proj.weight"] = {3 * D + 2 * F, D};
    m[p + "to_out.weight"] = {D, D + F};
    m[p + "norm_q.weight"] = {H};
    m[p + "norm_k.weight"] = {H};
  }
  return m;
}

ShapeMap expected_text_encoder(const TextEncoderConfig& c) {
  const int64_t h = c.hidden, hd = c.head_dim;
  const std::string t = "text_encoder.model.";
  ShapeMap m;
  m[t + "embed_tokens.weight"] = {c.vocab_size, h};
  for (int64_t l = 0; l < c.layers_needed(); ++l) {
    const std::string p = t + "layers." + idx(l) + ".";
    m[p + "input_layernorm.weight"] = {h};
    m[p + "post_attention_layernorm.weight"] = {h};
    m[p + "self_attn.q_proj.weight"] = {c.num_heads * hd, h};
    m[p + "self_attn.k_proj.weight"] = {c.num_kv_heads * hd, h};
    m[p + "self_attn.v_proj.weight"] = {c.num_kv_heads * hd, h};
    m[p + "self_attn.o_proj.weight"] = {h, c.num_heads * hd};
    if (c.qk_norm) {
      m[p + "self_attn.q_norm.weight"] = {hd};
      m[p + "self_attn.k_norm.weight"] = {hd};
    }
    m[p + "mlp.gate_proj.weight"] = {c.intermediate, h};
    m[p + "mlp.up_proj.weight"] = {c.intermediate, h};
    m[p + "mlp.down_proj.weight"] = {h, c.intermediate};
  }
  return m;
}

namespace {

void add_conv(ShapeMap& m, const std::string& p, int64_t out, int64_t in, int64_t k) {
  m[p + ".weight"] = {out, in, k, k};
  m[p + ".bias"] = {out};
}
void add_norm(ShapeMap& m, const std::string& p, int64_t ch) {
  m[p + ".weight"] = {ch};
  m[p + ".bias"] = {ch};
}
void add_resnet(ShapeMap& m, const std::string& p, int64_t in, int64_t out) {
  add_norm(m, p + ".norm1", in);
  add_conv(m, p + ".conv1", out, in, 3);
  add_norm(m, p + ".norm2", out);
  add_conv(m, p + ".conv2", out, out, 3);
  if (in != out) add_conv(m, p + ".conv_shortcut", out, in, 1);
}
void add_mid_block(ShapeMap& m, const std::string& p, int64_t ch, bool attention) {
  add_resnet(m, p + ".resnets.0", ch, ch);
  add_resnet(m, p + ".resnets.1", ch, ch);
  if (!attention) return;
  add_norm(m, p + ".attentions.0.group_norm", ch);
  for (const char* n : {"to_q", "to_k", "to_v", "to_out.0"}) {
    m[p + ".attentions.0." + n + ".weight"] = {ch, ch};
    m[p + ".attentions.0." + n + ".bias"] = {ch};
  }
}

}  // namespace

ShapeMap expected_vae(const VaeConfig& c) {
  ShapeMap m;
  const auto& enc = c.block_out_channels;
  const int64_t levels = int64_t(enc.size());
  add_conv(m, "vae.encoder.conv_in", enc[0], c.in_channels, 3);
  int64_t ch = enc[0];
  for (int64_t i = 0; i < levels; ++i) {
    const std::string p = "vae.encoder.down_blocks." + idx(i);
    for (int64_t j = 0; j < c.layers_per_block; ++j) {
      add_resnet(m, p + ".resnets." + idx(j), ch, enc[size_t(i)]);
      ch = enc[size_t(i)];
    }
    if (i + 1 < levels) add_conv(m, p + ".downsamplers.0.conv", ch, ch, 3);
  }
  add_mid_block(m, "vae.encoder.mid_block", ch, c.mid_block_attention);
  add_norm(m, "vae.encoder.conv_norm_out", ch);
  add_conv(m, "vae.encoder.conv_out", 2 * c.latent_channels, ch, 3);
  if (c.use_quant_conv) add_conv(m, "vae.quant_conv", 2 * c.latent_channels, 2 * c.latent_channels, 1);

  const auto& dec = c.decoder_channels();
  if (c.use_post_quant_conv) add_conv(m, "vae.post_quant_conv", c.latent_channels, c.latent_channels, 1);
  ch = dec.back();
  add_conv(m, "vae.decoder.conv_in", ch, c.latent_channels, 3);
  add_mid_block(m, "vae.decoder.mid_block", ch, c.mid_block_attention);
  for (int64_t k = 0; k < levels; ++k) {
    const int64_t out = dec[size_t(levels - 1 - k)];
    const std::string p = "vae.decoder.up_blocks." + idx(k);
    for (int64_t j = 0; j < c.layers_per_block + 1; ++j) {
      add_resnet(m, p + ".resnets." + idx(j), ch, out);
      ch = out;
    }
    if (k + 1 < levels) add_conv(m, p + ".upsamplers.0.conv", ch, ch, 3);
  }
  add_norm(m, "vae.decoder.conv_norm_out", ch);
  add_conv(m, "vae.decoder.conv_out", c.out_channels, ch, 3);
  if (c.latent_batch_norm) {
    m["vae.bn.running_mean"] = {c.packed_channels()};
    m["vae.bn.running_var"] = {c.packed_channels()};
  }
  return m;
}

TransformerConfig infer_transformer_config(const ShapeMap& t, const std::string& where) {
  TransformerConfig c;
  const Shape& x = shape_of(t, "transformer.x_embedder.weight", where);
  const Shape& ctx = shape_of(t, "transformer.context_embedder.weight", where);
  const Shape& t1 = shape_of(t, "transformer.time_guidance_embed.timestep_embedder.linear_1.weight", where);
  const Shape& out = shape_of(t, "transformer.proj_out.weight", where);
  check(x.size() == 2 && ctx.size() == 2 && t1.size() == 2 && out.size() == 2, where,
        ": embedder weights must be 2-D");
  c.guidance_embeds = t.count("transformer.time_guidance_embed.guidance_embedder.linear_1.weight") > 0;
  const int64_t D = x[0];
  c.in_channels = x[1];
  c.out_channels = out[0];
  c.context_dim = ctx[1];
  c.timestep_channels = t1[1];
  c.num_double_blocks = count_indexed(t, "transformer.transformer_blocks.", where);
  c.num_single_blocks = count_indexed(t, "transformer.single_transformer_blocks.", where);
  const std::string qn = c.num_double_blocks ? "transformer.transformer_blocks.0.attn.norm_q.weight"
                                             : "transformer.single_transformer_blocks.0.attn.norm_q.weight";
  c.head_dim = shape_of(t, qn, where)[0];
  check(c.head_dim > 0 && D % c.head_dim == 0, where, ": inner width ", D,
        " is not a multiple of the head width ", c.head_dim);
  c.num_heads = D / c.head_dim;
  if (c.num_double_blocks) {
    const Shape& ff = shape_of(t, "transformer.transformer_blocks.0.ff.linear_out.weight", where);
    c.mlp_ratio = double(ff[1]) / double(D);
  }
  c.rope_axes = {c.head_dim / 4, c.head_dim / 4, c.head_dim / 4, c.head_dim / 4};
  return c;
}

TextEncoderConfig infer_text_encoder_config(const ShapeMap& t, const std::string& where,
                                            int64_t head_dim) {
  TextEncoderConfig c;
  const Shape& e = shape_of(t, "text_encoder.model.embed_tokens.weight", where);
  c.vocab_size = e[0];
  c.hidden = e[1];
  c.num_layers = count_indexed(t, "text_encoder.model.layers.", where);
  const std::string p = "text_encoder.model.layers.0.";
  // Qwen3's per-head q_norm gives the head width; Mistral has none: `head_dim` then.
  c.qk_norm = t.count(p + "self_attn.q_norm.weight") > 0;
  c.head_dim = c.qk_norm ? shape_of(t, p + "self_attn.q_norm.weight", where)[0] : head_dim;
  const int64_t q_rows = shape_of(t, p + "self_attn.q_proj.weight", where)[0];
  const int64_t k_rows = shape_of(t, p + "self_attn.k_proj.weight", where)[0];
  if (!c.qk_norm)
    check(c.head_dim > 0 && q_rows % c.head_dim == 0 && k_rows % c.head_dim == 0 && k_rows > 0,
          where, ": a Mistral text encoder's head width cannot be measured from its weights, "
          "and Mistral Small's ", c.head_dim, " does not divide its projections (q_proj ", q_rows,
          " rows, k_proj ", k_rows, "): put its config.json beside the file, or give -m with "
          "the model's directory");
  c.num_heads = q_rows / c.head_dim;
  c.num_kv_heads = k_rows / c.head_dim;
  if (!c.qk_norm) {
    // Neither shows in the weights: Mistral Small 3.1's (FLUX.2-dev's text_encoder/config.json).
    c.rope_theta = 1e9;
    c.rms_eps = 1e-5;
  }
  c.intermediate = shape_of(t, p + "mlp.gate_proj.weight", where)[0];
  return c;
}

VaeConfig infer_vae_config(const ShapeMap& t, const std::string& where) {
  VaeConfig c;
  c.block_out_channels.clear();
  const int64_t levels = count_indexed(t, "vae.encoder.down_blocks.", where);
  for (int64_t i = 0; i < levels; ++i)
    c.block_out_channels.push_back(
        shape_of(t, "vae.encoder.down_blocks." + idx(i) + ".resnets.0.conv2.weight", where)[0]);
  c.layers_per_block = count_indexed(t, "vae.encoder.down_blocks.0.resnets.", where);
  c.in_channels = shape_of(t, "vae.encoder.conv_in.weight", where)[1];
  c.out_channels = shape_of(t, "vae.decoder.conv_out.weight", where)[0];
  c.latent_channels = shape_of(t, "vae.decoder.conv_in.weight", where)[1];
  std::vector<int64_t> dec;
  for (int64_t k = levels - 1; k >= 0; --k)
    dec.push_back(shape_of(t, "vae.decoder.up_blocks." + idx(k) + ".resnets.0.conv2.weight", where)[0]);
  if (dec != c.block_out_channels) c.decoder_block_out_channels = dec;
  c.use_quant_conv = t.count("vae.quant_conv.weight") > 0;
  c.use_post_quant_conv = t.count("vae.post_quant_conv.weight") > 0;
  c.mid_block_attention = t.count("vae.decoder.mid_block.attentions.0.to_q.weight") > 0;
  c.latent_batch_norm = t.count("vae.bn.running_mean") > 0;
  if (!c.latent_batch_norm) return c;
  const int64_t packed = shape_of(t, "vae.bn.running_mean", where)[0];
  check(packed == 4 * c.latent_channels, where, ": bn.running_mean has ", packed,
        " channels; expected 4 x latent channels = ", 4 * c.latent_channels);
  return c;
}

void check_tensors(const ShapeMap& expected, const ShapeMap& actual, Component c,
                   const std::string& where) {
  std::vector<std::string> missing;
  for (const auto& [name, shape] : expected) {
    auto it = actual.find(name);
    if (it == actual.end()) {
      missing.push_back(name);
      continue;
    }
    check(it->second == shape, where, ": ", component_name(c), " tensor ", name, " has shape ",
          shape_str(it->second), " but the configuration implies ", shape_str(shape));
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += "\n  " + missing[i];
    if (missing.size() > 5) list += "\n  ... and " + std::to_string(missing.size() - 5) + " more";
    fail(where, ": the ", component_name(c), " lacks ", missing.size(), " tensor(s):", list);
  }
}

}  // namespace klein
