#include "weights/model_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "formats/container/reader.h"
#include "weights/container_store.h"
#include "weights/expected.h"
#include "weights/gguf_source.h"
#include "weights/fp8.h"
#include "weights/source_store.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& path) {
  json j = json::parse(read_text_file(path), nullptr, false);
  check(!j.is_discarded(), path.string(), ": not valid JSON");
  return j;
}

// The weights file of a diffusers component directory: a single safetensors file, or the
// index of a sharded one.
fs::path component_weights(const fs::path& dir, const std::string& stem) {
  for (const fs::path& p : {dir / (stem + ".safetensors.index.json"), dir / (stem + ".safetensors")})
    if (fs::exists(p)) return p;
  fail(dir.string(), ": no ", stem, ".safetensors (or its .index.json) found");
}

struct Located {
  fs::path weights;     // .safetensors or .index.json
  fs::path config;      // config.json, empty for single files
};

struct Discovered {
  Located transformer, text_encoder, vae;
  fs::path scheduler_config;
  fs::path model_index;
};

Discovered discover(const ModelPaths& paths) {
  Discovered d;
  if (!paths.model.empty()) {
    const fs::path& m = paths.model;
    check(fs::exists(m), "model path ", m.string(), " does not exist");
    check(fs::is_directory(m), m.string(), " is not a model directory (expected the diffusers "
          "directory of FLUX.2-klein with model_index.json)");
    d.model_index = m / "model_index.json";
    check(fs::exists(d.model_index), m.string(), ": no model_index.json: not a diffusers model "
          "directory (expected model_index.json, transformer/, text_encoder/, vae/, tokenizer/)");
    json index = read_json(d.model_index);
    if (index.contains("_class_name") && index["_class_name"].is_string()) {
      const std::string cls = index["_class_name"];
      check(cls.find("Flux2") != std::string::npos, d.model_index.string(), ": pipeline class ",
            cls, " is not a FLUX.2 pipeline");
    }
    auto sub = [&](const char* name, const char* stem) {
      Located l;
      l.config = m / name / "config.json";
      check(fs::exists(l.config), m.string(), ": missing ", name, "/config.json");
      l.weights = component_weights(m / name, stem);
      return l;
    };
    if (paths.diffusion_model.empty()) d.transformer = sub("transformer", "diffusion_pytorch_model");
    if (paths.text_encoder.empty()) d.text_encoder = sub("text_encoder", "model");
    if (paths.vae.empty()) d.vae = sub("vae", "diffusion_pytorch_model");
    if (fs::exists(m / "scheduler" / "scheduler_config.json"))
      d.scheduler_config = m / "scheduler" / "scheduler_config.json";
  }
  auto single = [](const fs::path& p, const char* option) {
    check(fs::exists(p), option, ": ", p.string(), " does not exist");
    check(fs::is_regular_file(p), option, ": ", p.string(), " is not a file");
    return Located{p, {}};
  };
  if (!paths.diffusion_model.empty()) d.transformer = single(paths.diffusion_model, "--diffusion-model");
  if (!paths.text_encoder.empty()) d.text_encoder = single(paths.text_encoder, "--text-encoder");
  if (!paths.vae.empty()) d.vae = single(paths.vae, "--vae");
  std::string missing;
  if (d.transformer.weights.empty()) missing += " --diffusion-model";
  if (d.text_encoder.weights.empty()) missing += " --text-encoder";
  if (d.vae.weights.empty()) missing += " --vae";
  check(missing.empty(), "no model given for:", missing, " (give -m DIR, or each file)");
  return d;
}

ShapeMap canonical_shapes(const SourceComponent& c) {
  ShapeMap m;
  for (const auto& t : c.tensors) {
    const std::optional<Weight> stored = c.stored(t.source);
    check(!m.count(t.canonical), c.path().string(), ": tensor ", t.canonical,
          " is given twice (under two spellings)");
    m[t.canonical] = canonical_shape(t, stored->shape);
  }
  return m;
}

SourceComponent open_component(Component kind, const Located& where) {
  const fs::path& weights = where.weights;
  SourceComponent c;
  c.component = kind;
  c.config_file = where.config;
  if (is_gguf(weights)) {
    c.gguf = std::make_unique<gguf::File>(weights);
    std::map<std::string, std::string> name_in_file;
    const std::vector<NamedShape> names = gguf_tensor_names(kind, *c.gguf, name_in_file);
    c.layout = detect_layout(kind, names);
    c.tensors = map_component(kind, names, weights.string());
    for (TensorSource& t : c.tensors) t.source = name_in_file.at(t.source);
    return c;
  }
  c.files = std::make_unique<SafetensorsSet>(weights);
  // fp8 scales and markers travel beside the weights; the name mapping sees the weights only.
  Fp8Tensors fp8 = find_fp8_tensors(*c.files, weights.string());
  c.fp8_scales = std::move(fp8.scale_of);
  const std::set<std::string> companions(fp8.companions.begin(), fp8.companions.end());
  std::vector<NamedShape> names;
  for (const auto& t : c.files->tensors())
    if (!companions.count(t.entry->name)) names.push_back({t.entry->name, t.entry->shape});
  c.layout = detect_layout(kind, names);
  c.tensors = map_component(kind, names, weights.string());
  return c;
}

// Field-by-field comparison of a config.json with what the tensors imply.
template <class T>
void same(const T& from_file, const T& from_shapes, const char* key, const fs::path& where) {
  check(from_file == from_shapes, where.string(), ": \"", key, "\" does not match the weights "
        "(config says ", from_file, ", tensor shapes say ", from_shapes, ")");
}

std::string vec_str(const std::vector<int64_t>& v) { return shape_str(v); }

// The components must belong together: the transformer reads the text encoder's stacked
// hidden states and the VAE's packed latents.
void check_pairing(const ModelConfig& c, const Discovered& d) {
  const auto& t = c.transformer;
  const auto& e = c.text_encoder;
  check(t.context_dim == e.context_dim(), "the transformer (", d.transformer.weights.string(),
        ") expects a text context ", t.context_dim, " wide, but the text encoder (",
        d.text_encoder.weights.string(), ", hidden size ", e.hidden, ") gives 3 x ", e.hidden, " = ",
        e.context_dim(), ". FLUX.2-klein-4B pairs with Qwen3-4B (hidden 2560), klein-9B with "
        "Qwen3-8B (hidden 4096).");
  check(t.in_channels == c.vae.packed_channels(), "the transformer (",
        d.transformer.weights.string(), ") works on latents of ", t.in_channels,
        " channels, but the VAE (", d.vae.weights.string(), ") gives ", c.vae.latent_channels,
        " x 2 x 2 = ", c.vae.packed_channels(), " (a VAE of another model family?)");
  check(t.out_channels == t.in_channels, d.transformer.weights.string(), ": out_channels ",
        t.out_channels, " differs from in_channels ", t.in_channels);
}

// What identifies a source file's contents for the prompt cache without reading gigabytes:
// the path, device and inode, size, modification time and change time. The change time is
// set by the kernel on every write and cannot be set back (touch restores only mtime), so a
// file rewritten in place with its size and mtime restored still gets a new identity.
std::string file_identity(const fs::path& p) {
  struct stat st {};
  std::string id = fs::absolute(p).string();
  if (::stat(p.c_str(), &st) == 0)
    id += ":" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
          std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
          std::to_string(st.st_mtim.tv_nsec) + ":" + std::to_string(st.st_ctim.tv_sec) + "." +
          std::to_string(st.st_ctim.tv_nsec);
  return id;
}

}  // namespace

const std::vector<std::string>& variant_names() {
  static const std::vector<std::string> names = {"4b", "4b-base", "9b", "9b-base", "9b-kv"};
  return names;
}

namespace {

std::string join_names() {
  std::string list;
  for (const auto& n : variant_names()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

// What a --variant name says: base (CFG) or distilled, the K/V pipeline, and the size.
struct Variant {
  bool distilled = true;
  bool reference_cache = false;
  bool nine_b = false;
};

Variant parse_variant(const std::string& name) {
  const auto& names = variant_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    fail("--variant ", name, ": expected one of ", join_names());
  return {name.find("-base") == std::string::npos, name == "9b-kv", name.rfind("9b", 0) == 0};
}

// Applies --variant to a configuration: checks it against what the weights or files already
// decide (the klein-4B's widths; a model_index.json's pipeline) and sets the rest.
void apply_variant(const std::string& name, bool declared, ModelConfig& config,
                   const std::string& where) {
  if (name.empty()) return;
  const Variant v = parse_variant(name);
  // klein-4B: inner width 3072 (24 heads x 128), Qwen3-4B text encoder (hidden 2560).
  const bool is_4b = config.transformer.inner_dim() == 3072 && config.text_encoder.hidden == 2560;
  check(!(v.nine_b && is_4b), "--variant ", name, ": ", where, " holds klein-4B weights "
        "(inner width 3072, text encoder hidden size 2560)");
  if (declared)
    check(config.is_distilled == v.distilled && config.reference_cache == v.reference_cache,
          "--variant ", name, ": ", where, " declares a ",
          config.reference_cache ? "K/V-cache" : config.is_distilled ? "distilled" : "base",
          " model; --variant is for checkpoints that do not say");
  config.is_distilled = v.distilled;
  config.reference_cache = v.reference_cache;
}

}  // namespace

std::unique_ptr<WeightStore> open_model(const ModelPaths& paths) {
  // A container holds every component (and the tokenizer).
  if (!paths.model.empty() && container::is_container(paths.model)) {
    check(paths.diffusion_model.empty() && paths.text_encoder.empty() && paths.vae.empty(),
          "-m ", paths.model.string(), " is a klein container, which holds every component; "
          "--diffusion-model, --text-encoder and --vae cannot be combined with it");
    auto store = std::make_unique<ContainerStore>(paths.model);
    ModelConfig config = store->config();
    apply_variant(paths.variant, true, config, paths.model.string());
    return store;
  }
  return open_source_model(paths);
}

std::unique_ptr<SourceStore> open_source_model(const ModelPaths& paths) {
  check(paths.model.empty() || !container::is_container(paths.model), paths.model.string(),
        ": a klein container, not an original checkpoint");
  const Discovered d = discover(paths);
  std::vector<SourceComponent> comps;
  comps.push_back(open_component(Component::Transformer, d.transformer));
  comps.push_back(open_component(Component::TextEncoder, d.text_encoder));
  comps.push_back(open_component(Component::Vae, d.vae));
  const ShapeMap t_shapes = canonical_shapes(comps[0]);
  const ShapeMap e_shapes = canonical_shapes(comps[1]);
  const ShapeMap v_shapes = canonical_shapes(comps[2]);

  ModelConfig config;
  config.name = !paths.model.empty() ? fs::absolute(paths.model).lexically_normal().filename().string()
                                     : d.transformer.weights.filename().string();
  // Configs: from config.json when there is one (cross-checked against the shapes),
  // otherwise from the shapes alone.
  const TransformerConfig t_inferred = infer_transformer_config(t_shapes, d.transformer.weights.string());
  const TextEncoderConfig e_inferred = infer_text_encoder_config(e_shapes, d.text_encoder.weights.string());
  const VaeConfig v_inferred = infer_vae_config(v_shapes, d.vae.weights.string());
  if (!d.transformer.config.empty()) {
    const auto& f = d.transformer.config;
    config.transformer = parse_transformer_config(read_json(f), f.string());
    const auto& a = config.transformer;
    const auto& b = t_inferred;
    same(a.num_double_blocks, b.num_double_blocks, "num_layers", f);
    same(a.num_single_blocks, b.num_single_blocks, "num_single_layers", f);
    same(a.head_dim, b.head_dim, "attention_head_dim", f);
    same(a.num_heads, b.num_heads, "num_attention_heads", f);
    same(a.context_dim, b.context_dim, "joint_attention_dim", f);
    same(a.in_channels, b.in_channels, "in_channels", f);
    same(a.mlp_hidden(), b.mlp_hidden(), "mlp_ratio (as MLP width)", f);
  } else {
    config.transformer = t_inferred;
  }
  if (!d.text_encoder.config.empty()) {
    const auto& f = d.text_encoder.config;
    config.text_encoder = parse_text_encoder_config(read_json(f), f.string());
    const auto& a = config.text_encoder;
    const auto& b = e_inferred;
    same(a.hidden, b.hidden, "hidden_size", f);
    same(a.vocab_size, b.vocab_size, "vocab_size", f);
    same(a.num_heads, b.num_heads, "num_attention_heads", f);
    same(a.num_kv_heads, b.num_kv_heads, "num_key_value_heads", f);
    same(a.head_dim, b.head_dim, "head_dim", f);
    same(a.intermediate, b.intermediate, "intermediate_size", f);
    check(b.num_layers >= a.layers_needed(), f.string(), ": the weights hold ", b.num_layers,
          " layers; the pipeline needs ", a.layers_needed());
  } else {
    config.text_encoder = e_inferred;
  }
  if (!d.vae.config.empty()) {
    const auto& f = d.vae.config;
    config.vae = parse_vae_config(read_json(f), f.string());
    const auto& a = config.vae;
    const auto& b = v_inferred;
    if (a.block_out_channels != b.block_out_channels)
      fail(f.string(), ": \"block_out_channels\" ", vec_str(a.block_out_channels),
           " does not match the weights ", vec_str(b.block_out_channels));
    same(a.latent_channels, b.latent_channels, "latent_channels", f);
    same(a.layers_per_block, b.layers_per_block, "layers_per_block", f);
  } else {
    config.vae = v_inferred;
  }
  if (!d.scheduler_config.empty())
    config.scheduler = parse_scheduler_config(read_json(d.scheduler_config), d.scheduler_config.string());
  if (!d.model_index.empty()) {
    json index = read_json(d.model_index);
    if (index.contains("is_distilled") && index["is_distilled"].is_boolean())
      config.is_distilled = index["is_distilled"];
    if (index.contains("_class_name") && index["_class_name"].is_string())
      config.reference_cache = index["_class_name"] == "Flux2KleinKVPipeline";
  }
  apply_variant(paths.variant, !d.model_index.empty(), config,
                d.model_index.empty() ? d.transformer.weights.string() : d.model_index.string());
  if (d.model_index.empty() && paths.variant.empty()) {
    // No model_index.json: distilled, base or K/V is not in the weights. BFL's file names say
    // it (flux-2-klein-4b, flux-2-klein-base-9b, ...; diffusers' conversion script reads them
    // the same way); anything else is left undecided for the caller to refuse.
    std::string name = d.transformer.weights.filename().string();
    for (char& ch : name) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (name.find("klein") != std::string::npos) {
      config.is_distilled = name.find("base") == std::string::npos;
      config.reference_cache = name.find("kv") != std::string::npos;
    } else {
      config.undecided_variant =
          d.transformer.weights.string() + ": without a model_index.json nothing says whether "
          "this klein is distilled, base or the K/V-cache model (the weights are the same "
          "shape, and the file name is not one of BFL's, such as flux-2-klein-base-4b); give "
          "--variant " + join_names();
    }
  }

  check_tensors(expected_transformer(config.transformer), t_shapes, Component::Transformer,
                d.transformer.weights.string());
  check_tensors(expected_text_encoder(config.text_encoder), e_shapes, Component::TextEncoder,
                d.text_encoder.weights.string());
  check_tensors(expected_vae(config.vae), v_shapes, Component::Vae, d.vae.weights.string());
  check_pairing(config, d);

  std::string identity;
  for (const auto& c : comps)
    for (const MappedFile* f : c.mapped()) identity += file_identity(f->path()) + ";";
  return std::make_unique<SourceStore>(std::move(comps), std::move(config), identity);
}

const char* tokenizer_kind_name(TokenizerSource::Kind kind) {
  switch (kind) {
    case TokenizerSource::Kind::Directory:
      return "directory";
    case TokenizerSource::Kind::Gguf:
      return "gguf";
    case TokenizerSource::Kind::Container:
      return "container";
  }
  return "?";
}

TokenizerSource tokenizer_source(const ModelPaths& paths) {
  using Kind = TokenizerSource::Kind;
  auto holds_tokenizer = [](const fs::path& dir) {
    std::error_code ec;
    return fs::exists(dir / "vocab.json", ec) || fs::exists(dir / "tokenizer.json", ec);
  };
  if (!paths.tokenizer.empty()) {
    check(holds_tokenizer(paths.tokenizer), "--tokenizer ", paths.tokenizer.string(),
          ": no vocab.json or tokenizer.json there");
    return {Kind::Directory, paths.tokenizer};
  }
  if (!paths.model.empty() && container::is_container(paths.model))
    return {Kind::Container, paths.model};
  // A GGUF text encoder without tokenizer metadata is legal (llama.cpp needs one, other
  // writers may leave it out); the directory is asked next, and the errors say it lacked one.
  const bool gguf_text_encoder = is_gguf(paths.text_encoder);
  if (gguf_text_encoder && gguf::File(paths.text_encoder).value("tokenizer.ggml.model"))
    return {Kind::Gguf, paths.text_encoder};
  const std::string gguf_lacks =
      gguf_text_encoder ? "--text-encoder " + paths.text_encoder.string() +
                              " carries no tokenizer (no tokenizer.ggml.model in its metadata)"
                        : "";
  if (!paths.model.empty()) {
    const fs::path dir = paths.model / "tokenizer";
    const std::string also = gguf_lacks.empty() ? "" : " and " + gguf_lacks;
    check(fs::is_directory(dir), paths.model.string(), ": no tokenizer/ directory", also,
          " (give --tokenizer DIR)");
    check(holds_tokenizer(dir), dir.string(), ": no vocab.json or tokenizer.json there", also,
          " (give --tokenizer DIR)");
    return {Kind::Directory, dir};
  }
  check(gguf_lacks.empty(), gguf_lacks, "; give --tokenizer DIR");
  check(paths.text_encoder.empty(), "--text-encoder ", paths.text_encoder.string(),
        " carries no tokenizer (of single files only a llama.cpp GGUF text encoder does); "
        "give --tokenizer DIR");
  fail("no tokenizer given: use -m DIR or --tokenizer DIR");
}

}  // namespace klein
