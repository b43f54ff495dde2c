#include "weights/model_source.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "core/json_fields.h"
#include "formats/container/reader.h"
#include "weights/container_store.h"
#include "weights/expected.h"
#include "weights/family.h"
#include "weights/gguf_source.h"
#include "weights/fp8.h"
#include "tokenizer/tekken.h"
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
  // From model_index.json's pipeline class; null for single files, whose transformer's
  // tensor names decide.
  const ModelFamily* family = nullptr;
};

// The config.json of a text encoder given as a file, when one lies beside it (a Hub snapshot's
// text_encoder/ folder) and describes a text model this engine reads (Qwen3, Mistral): it
// gives what the weights cannot, Mistral's head width (no per-head norm to measure). Any other
// config.json there belongs to something else and is left alone.
fs::path text_encoder_config_beside(const fs::path& weights) {
  const fs::path config = weights.parent_path() / "config.json";
  if (!fs::is_regular_file(config)) return {};
  json j;
  try {
    j = read_json(config);
  } catch (const Error&) {
    return {};
  }
  const bool typed = j.is_object() && j.contains("model_type") && j["model_type"].is_string();
  const std::string type = typed ? j["model_type"].get<std::string>() : "";
  return type == "qwen3" || type == "mistral" || type == "mistral3" ? config : fs::path();
}

// The components' files. `text_encoder_only`: the text encoder alone (prompt upsampling),
// the transformer and the VAE neither looked for nor required.
Discovered discover(const ModelPaths& paths, bool text_encoder_only = false) {
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
    d.family = model_families().front();  // directories from before the class was written
    if (index.contains("_class_name") && index["_class_name"].is_string())
      d.family = &family_of_pipeline(index["_class_name"], d.model_index.string());
    auto sub = [&](const char* name, const char* stem) {
      Located l;
      l.config = m / name / "config.json";
      check(fs::exists(l.config), m.string(), ": missing ", name, "/config.json");
      l.weights = component_weights(m / name, stem);
      return l;
    };
    if (paths.diffusion_model.empty() && !text_encoder_only)
      d.transformer = sub("transformer", "diffusion_pytorch_model");
    if (paths.text_encoder.empty()) d.text_encoder = sub("text_encoder", "model");
    if (paths.vae.empty() && !text_encoder_only) d.vae = sub("vae", "diffusion_pytorch_model");
    if (fs::exists(m / "scheduler" / "scheduler_config.json"))
      d.scheduler_config = m / "scheduler" / "scheduler_config.json";
  }
  auto single = [](const fs::path& p, const char* option) {
    check(fs::exists(p), option, ": ", p.string(), " does not exist");
    check(fs::is_regular_file(p), option, ": ", p.string(), " is not a file");
    return Located{p, {}};
  };
  if (!paths.diffusion_model.empty() && !text_encoder_only)
    d.transformer = single(paths.diffusion_model, "--diffusion-model");
  if (!paths.text_encoder.empty()) {
    d.text_encoder = single(paths.text_encoder, "--text-encoder");
    d.text_encoder.config = text_encoder_config_beside(paths.text_encoder);
    // Else the configuration of -m's own text encoder, if it has one: a file that replaces
    // it (another precision, ComfyUI's copy) is the same model. The shapes are checked
    // against it as for any config.json, so a file of another model is refused.
    if (d.text_encoder.config.empty() && !paths.model.empty() &&
        fs::is_regular_file(paths.model / "text_encoder" / "config.json"))
      d.text_encoder.config = paths.model / "text_encoder" / "config.json";
  }
  if (!paths.vae.empty() && !text_encoder_only) d.vae = single(paths.vae, "--vae");
  if (text_encoder_only) {
    check(!d.text_encoder.weights.empty(), "no text encoder given: give -m DIR or "
          "--text-encoder FILE (with --tokenizer DIR)");
    return d;
  }
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

// The family of a single transformer file: the first that recognises its tensor names, else
// FLUX.2-klein (whose mapping names what it does not know).
const ModelFamily& family_of_transformer(const std::vector<NamedShape>& names) {
  for (const ModelFamily* f : model_families())
    if (f != model_families().front() && f->recognises_transformer(names)) return *f;
  return *model_families().front();
}

// Maps a component's tensors to canonical names: the transformer's by its family (found from
// the names when `family` is null), the others as every family has them.
void map_names(SourceComponent& c, const std::vector<NamedShape>& names, const std::string& where,
               const ModelFamily*& family) {
  if (c.component == Component::Transformer) {
    if (!family) family = &family_of_transformer(names);
    c.layout = family->transformer_layout(names);
    c.tensors = family->map_transformer(names, where);
  } else {
    c.layout = detect_layout(c.component, names);
    c.tensors = map_component(c.component, names, where);
  }
}

SourceComponent open_component(Component kind, const Located& where, const ModelFamily*& family) {
  const fs::path& weights = where.weights;
  SourceComponent c;
  c.component = kind;
  c.config_file = where.config;
  if (is_gguf(weights)) {
    c.gguf = std::make_unique<gguf::File>(weights);
    std::map<std::string, std::string> name_in_file;
    const std::vector<NamedShape> names = gguf_tensor_names(kind, *c.gguf, name_in_file);
    map_names(c, names, weights.string(), family);
    for (TensorSource& t : c.tensors) {
      if (kind == Component::TextEncoder)
        t.rope_interleaved_heads = gguf_rope_interleaved_heads(*c.gguf, t.canonical);
      t.source = name_in_file.at(t.source);
    }
    return c;
  }
  c.files = std::make_unique<SafetensorsSet>(weights);
  // fp8 scales and markers travel beside the weights; the name mapping sees the weights only.
  Fp8Tensors fp8 = find_fp8_tensors(*c.files, weights.string());
  c.fp8_scales = std::move(fp8.scale_of);
  std::set<std::string> companions(fp8.companions.begin(), fp8.companions.end());
  // A tokenizer travelling with a text encoder is not one of its weights.
  if (kind == Component::TextEncoder) companions.insert(kTekkenTensor);
  std::vector<NamedShape> names;
  for (const auto& t : c.files->tensors())
    if (!companions.count(t.entry->name)) names.push_back({t.entry->name, t.entry->shape});
  map_names(c, names, weights.string(), family);
  return c;
}

// The text encoder's configuration: from its config.json when there is one (cross-checked
// against the weights' shapes), otherwise from the shapes (and a GGUF's metadata) alone; the
// layers `family`'s pipeline reads must be there.
TextEncoderConfig text_encoder_config(const Located& where, const SourceComponent& c,
                                      const ShapeMap& e_shapes, const ModelFamily& family) {
  const std::string weights = where.weights.string();
  if (!where.config.empty()) {
    const auto& f = where.config;
    const json j = read_json(f);
    const TextEncoderConfig a = parse_text_encoder_config(
        j, f.string(), family.text_output_layers(text_encoder_layers(j, f.string())));
    const TextEncoderConfig b = infer_text_encoder_config(e_shapes, weights, a.head_dim);
    auto same = [&](int64_t file, int64_t inferred, const char* key) {
      check_config_matches_weights(f.string(), key, file, inferred);
    };
    same(a.hidden, b.hidden, "hidden_size");
    same(a.vocab_size, b.vocab_size, "vocab_size");
    same(a.num_heads, b.num_heads, "num_attention_heads");
    same(a.num_kv_heads, b.num_kv_heads, "num_key_value_heads");
    same(a.head_dim, b.head_dim, "head_dim");
    same(a.intermediate, b.intermediate, "intermediate_size");
    check(b.num_layers >= a.layers_needed(), f.string(), ": the weights hold ", b.num_layers,
          " layers; the pipeline needs ", a.layers_needed());
    check(a.qk_norm == b.qk_norm, f.string(), ": model_type says ",
          a.qk_norm ? "qwen3 (q/k norms in every layer)" : "mistral (no q/k norms)",
          ", but the weights (", weights, ") ", b.qk_norm ? "have" : "have no",
          " self_attn.q_norm/k_norm: they are a ", b.qk_norm ? "Qwen3" : "Mistral", " model");
    return a;
  }
  // A llama.cpp Mistral's metadata says what its weights do not show.
  const GgufTextFacts facts = c.gguf ? gguf_text_facts(*c.gguf) : GgufTextFacts{};
  TextEncoderConfig e = infer_text_encoder_config(e_shapes, weights, facts.head_dim.value_or(128));
  if (facts.rope_theta) e.rope_theta = *facts.rope_theta;
  if (facts.rms_eps) e.rms_eps = *facts.rms_eps;
  e.output_layers = family.text_output_layers(e.num_layers);
  check(e.num_layers >= e.layers_needed(), weights, ": the text encoder has ", e.num_layers,
        " layers but the pipeline reads the output of layer ", e.layers_needed());
  return e;
}

std::string vec_str(const std::vector<int64_t>& v) { return shape_str(v); }

}  // namespace

const std::vector<std::string>& variant_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const ModelFamily* f : model_families())
      for (const std::string& n : f->variant_names()) all.push_back(n);
    return all;
  }();
  return names;
}

std::unique_ptr<WeightStore> open_model(const ModelPaths& paths) {
  // A container holds every component (and the tokenizer).
  if (!paths.model.empty() && container::is_container(paths.model)) {
    check(paths.diffusion_model.empty() && paths.text_encoder.empty() && paths.vae.empty(),
          "-m ", paths.model.string(), " is a klein container, which holds every component; "
          "--diffusion-model, --text-encoder and --vae cannot be combined with it");
    auto store = std::make_unique<ContainerStore>(paths.model);
    ModelConfig config = store->config();
    model_family(config).apply_variant(paths.variant, true, paths.model.string(), config);
    check(variant_name(config) == variant_name(store->config()), "--variant ", paths.variant,
          ": ", paths.model.string(), " was converted as ", variant_name(store->config()),
          "; a container keeps the variant it was converted with (convert again with --variant)");
    return store;
  }
  return open_source_model(paths);
}

std::unique_ptr<SourceStore> open_source_model(const ModelPaths& paths) {
  check(paths.model.empty() || !container::is_container(paths.model), paths.model.string(),
        ": a klein container, not an original checkpoint");
  const Discovered d = discover(paths);
  const ModelFamily* family = d.family;
  std::vector<SourceComponent> comps;
  comps.push_back(open_component(Component::Transformer, d.transformer, family));
  comps.push_back(open_component(Component::TextEncoder, d.text_encoder, family));
  comps.push_back(open_component(Component::Vae, d.vae, family));
  const ShapeMap t_shapes = canonical_shapes(comps[0]);
  const ShapeMap e_shapes = canonical_shapes(comps[1]);
  const ShapeMap v_shapes = canonical_shapes(comps[2]);
  const ModelFamily::Files files{d.transformer.weights.string(), d.text_encoder.weights.string(),
                                 d.vae.weights.string()};

  ModelConfig config;
  config.family = std::string(family->id());
  config.name = !paths.model.empty() ? fs::absolute(paths.model).lexically_normal().filename().string()
                                     : d.transformer.weights.filename().string();
  // Configs: from config.json when there is one (cross-checked against the shapes),
  // otherwise from the shapes alone.
  if (!d.transformer.config.empty()) {
    const auto& f = d.transformer.config;
    family->read_transformer_config(read_json(f), &t_shapes, f.string(), files.transformer,
                                    config);
  } else {
    family->infer_transformer_config(t_shapes, files.transformer, config);
  }
  config.text_encoder = text_encoder_config(d.text_encoder, comps[1], e_shapes, *family);
  const VaeConfig v_inferred = infer_vae_config(v_shapes, files.vae);
  if (!d.vae.config.empty()) {
    const auto& f = d.vae.config;
    config.vae = parse_vae_config(read_json(f), f.string());
    const auto& a = config.vae;
    const auto& b = v_inferred;
    if (a.block_out_channels != b.block_out_channels)
      fail(f.string(), ": \"block_out_channels\" ", vec_str(a.block_out_channels),
           " does not match the weights ", vec_str(b.block_out_channels));
    for (auto [file, weights, key] : {std::tuple{a.latent_channels, b.latent_channels, "latent_channels"},
                                      std::tuple{a.layers_per_block, b.layers_per_block, "layers_per_block"}})
      check_config_matches_weights(f.string(), key, file, weights);
  } else {
    config.vae = v_inferred;
  }
  family->set_vae_latents(config.vae, !d.vae.config.empty());
  config.scheduler = d.scheduler_config.empty()
                         ? family->default_scheduler()
                         : parse_scheduler_config(read_json(d.scheduler_config),
                                                  d.scheduler_config.string());
  if (!d.model_index.empty()) family->read_model_index(read_json(d.model_index), config);
  family->apply_variant(paths.variant, !d.model_index.empty(),
                        d.model_index.empty() ? files.transformer : d.model_index.string(), config);
  if (d.model_index.empty() && paths.variant.empty())
    family->decide_undeclared_variant(files.transformer, config);

  for (Component c : {Component::Transformer, Component::TextEncoder, Component::Vae}) {
    const ShapeMap& shapes = c == Component::Transformer    ? t_shapes
                             : c == Component::TextEncoder ? e_shapes
                                                           : v_shapes;
    check_tensors(expected_tensors(config, c), shapes, c,
                  c == Component::Transformer    ? files.transformer
                  : c == Component::TextEncoder ? files.text_encoder
                                                : files.vae);
  }
  family->check_pairing(config, files);

  std::string identity;
  for (const auto& c : comps)
    for (const MappedFile* f : c.mapped()) identity += file_identity(f->path()) + ";";
  return std::make_unique<SourceStore>(std::move(comps), std::move(config), identity);
}

std::unique_ptr<WeightStore> open_text_encoder_model(const ModelPaths& paths) {
  if (!paths.model.empty() && container::is_container(paths.model)) return open_model(paths);
  const Discovered d = discover(paths, /*text_encoder_only=*/true);
  const ModelFamily* family = d.family ? d.family : model_families().front();
  std::vector<SourceComponent> comps;
  comps.push_back(open_component(Component::TextEncoder, d.text_encoder, family));
  const ShapeMap e_shapes = canonical_shapes(comps[0]);
  ModelConfig config;
  config.text_encoder = text_encoder_config(d.text_encoder, comps[0], e_shapes, *family);
  if (!d.family) {
    // No model_index.json names the pipeline: the first family that reads this text encoder.
    for (const ModelFamily* f : model_families())
      if (f->reads_text_encoder(config.text_encoder)) {
        family = f;
        break;
      }
    config.text_encoder = text_encoder_config(d.text_encoder, comps[0], e_shapes, *family);
  }
  config.family = std::string(family->id());
  config.name = !paths.model.empty() ? fs::absolute(paths.model).lexically_normal().filename().string()
                                     : d.text_encoder.weights.filename().string();
  check_tensors(expected_tensors(config, Component::TextEncoder), e_shapes, Component::TextEncoder,
                d.text_encoder.weights.string());
  std::string identity;
  for (const MappedFile* f : comps[0].mapped()) identity += file_identity(f->path()) + ";";
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
    case TokenizerSource::Kind::Tekken:
      return "tekken";
  }
  return "?";
}

bool holds_tokenizer(const fs::path& dir) {
  std::error_code ec;
  return fs::exists(dir / "vocab.json", ec) || fs::exists(dir / "tokenizer.json", ec) ||
         fs::exists(dir / "tekken.json", ec);
}

TokenizerSource tokenizer_source(const ModelPaths& paths) {
  using Kind = TokenizerSource::Kind;
  if (!paths.tokenizer.empty()) {
    check(holds_tokenizer(paths.tokenizer), "--tokenizer ", paths.tokenizer.string(),
          ": no vocab.json, tokenizer.json or tekken.json there");
    return {Kind::Directory, paths.tokenizer};
  }
  if (!paths.model.empty() && container::is_container(paths.model))
    return {Kind::Container, paths.model};
  // A GGUF text encoder without tokenizer metadata is legal (llama.cpp needs one, other
  // writers may leave it out); the directory is asked next, and the errors say it lacked one.
  const bool gguf_text_encoder = is_gguf(paths.text_encoder);
  if (gguf_text_encoder && gguf::File(paths.text_encoder).value("tokenizer.ggml.model"))
    return {Kind::Gguf, paths.text_encoder};
  // ComfyUI's Mistral text encoders carry Mistral's tekken.json in a tensor.
  if (!paths.text_encoder.empty() && !gguf_text_encoder && fs::is_regular_file(paths.text_encoder)) {
    auto files = std::make_shared<const SafetensorsSet>(paths.text_encoder);
    if (files->find(kTekkenTensor)) return {Kind::Tekken, paths.text_encoder, std::move(files)};
  }
  const std::string gguf_lacks =
      gguf_text_encoder ? "--text-encoder " + paths.text_encoder.string() +
                              " carries no tokenizer (no tokenizer.ggml.model in its metadata)"
                        : "";
  if (!paths.model.empty()) {
    const fs::path dir = paths.model / "tokenizer";
    const std::string also = gguf_lacks.empty() ? "" : " and " + gguf_lacks;
    check(fs::is_directory(dir), paths.model.string(), ": no tokenizer/ directory", also,
          " (give --tokenizer DIR)");
    check(holds_tokenizer(dir), dir.string(), ": no vocab.json, tokenizer.json or tekken.json there",
          also, " (give --tokenizer DIR)");
    return {Kind::Directory, dir};
  }
  check(gguf_lacks.empty(), gguf_lacks, "; give --tokenizer DIR");
  check(paths.text_encoder.empty(), "--text-encoder ", paths.text_encoder.string(),
        " carries no tokenizer (of single files only a llama.cpp GGUF text encoder, or a "
        "Mistral one with a tekken_model tensor, does); "
        "give --tokenizer DIR");
  fail("no tokenizer given: use -m DIR or --tokenizer DIR");
}

}  // namespace klein
