#include "weights/summary.h"

#include "formats/container/reader.h"
#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/container/reader.h"
#include "weights/family.h"
#include "weights/gguf_source.h"
#include "weights/source_store.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::json;

void TensorCounts::add(DType dtype, const Shape& shape) {
  const int64_t n = numel(shape);
  tensors += 1;
  if (dtype_is_float(dtype) || dtype_is_fp8(dtype)) parameters += n;
  bytes += uint64_t(n) * dtype_size(dtype);
}

TensorCounts& TensorCounts::operator+=(const TensorCounts& o) {
  tensors += o.tensors;
  parameters += o.parameters;
  bytes += o.bytes;
  return *this;
}

namespace {

// "layer.9" before "layer.10": digit runs compare as numbers, so units list in model order.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      const std::string na = a.substr(i, ie - i), nb = b.substr(j, je - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ie;
      j = je;
      continue;
    }
    if (a[i] != b[j]) return a[i] < b[j];
    ++i;
    ++j;
  }
  return a.size() - i < b.size() - j;
}

bool read_by_inference(const std::string& unit, const ModelConfig& config) {
  if (unit == "text_encoder.norm" || unit == "text_encoder.lm_head") return false;
  const std::string layer = "text_encoder.layer.";
  if (unit.rfind(layer, 0) == 0)
    return std::stoll(unit.substr(layer.size())) < config.text_encoder.layers_needed();
  return true;
}

ComponentSummary summarize_component(const SourceComponent& c, const ModelConfig& config) {
  ComponentSummary s;
  s.component = c.component;
  s.layout = c.layout;
  s.config_file = c.config_file;
  if (c.path().filename().string().ends_with(".index.json")) s.index_file = c.path();
  if (c.gguf) {
    // GGML types by their own names, with the bytes their blocks take.
    s.files.push_back(c.gguf->path());
    for (const auto& t : c.gguf->tensors()) {
      TensorCounts one;
      one.tensors = 1;
      one.parameters = numel(t.shape);
      one.bytes = t.end - t.begin;
      s.counts += one;
      s.dtypes[gguf::type_name(t.type)] += one;
    }
  } else {
    for (const auto& f : c.files->files()) {
      s.files.push_back(f->path());
      for (const auto& e : f->entries()) {
        s.counts.add(e.dtype, e.shape);
        s.dtypes[std::string(dtype_name(e.dtype))].add(e.dtype, e.shape);
      }
    }
  }
  // Units count canonical tensors: a BFL fused QKV projection is three tensors there.
  std::map<std::string, TensorCounts> units;
  for (const auto& t : c.tensors) {
    const std::optional<Weight> stored = c.stored(t.source);
    check(stored.has_value(), "internal: tensor ", t.source, " vanished");
    if (auto u = unit_of(model_family(config), t.canonical)) {
      const Shape shape = canonical_shape(t, stored->shape);
      if (dtype_is_float(stored->dtype) || !c.gguf) {
        units[u->unit].add(stored->dtype, shape);
      } else {  // GGUF blocks: their parameters, and their bytes as stored
        TensorCounts one;
        one.tensors = 1;
        one.parameters = numel(shape);
        one.bytes = uint64_t(stored->nbytes) / uint64_t(std::max<int64_t>(stored->shape[0], 1)) *
                    uint64_t(shape.empty() ? 1 : shape[0]);
        units[u->unit] += one;
      }
    }
    else
      s.unused.push_back(t.source);
  }
  for (auto& [name, counts] : units)
    s.units.push_back({name, counts, read_by_inference(name, config)});
  std::sort(s.units.begin(), s.units.end(), [](const UnitSummary& a, const UnitSummary& b) {
    return natural_less(a.name, b.name);
  });
  return s;
}

json counts_json(const TensorCounts& c) {
  return json{{"tensors", c.tensors}, {"parameters", c.parameters}, {"bytes", c.bytes}};
}

json path_or_null(const fs::path& p) { return p.empty() ? json(nullptr) : json(p.string()); }

}  // namespace

const char* component_key(Component c) {
  switch (c) {
    case Component::Transformer:
      return "transformer";
    case Component::TextEncoder:
      return "text_encoder";
    case Component::Vae:
      return "vae";
  }
  return "?";
}

ModelSummary summarize(const SourceStore& store) {
  ModelSummary s;
  s.config = store.config();
  s.name = s.config.name;
  for (const auto& c : store.components()) {
    s.components.push_back(summarize_component(c, s.config));
    s.total += s.components.back().counts;
  }
  return s;
}

ModelSummary describe_model(const ModelPaths& paths) {
  // A klein container describes itself from its own index; that has its own summary.
  check(paths.model.empty() || !container::is_container(paths.model), paths.model.string(),
        ": describing a klein container is not supported here (only original checkpoints)");
  const std::unique_ptr<SourceStore> source = open_source_model(paths);
  ModelSummary s = summarize(*source);
  s.model = paths.model;
  try {
    s.tokenizer = tokenizer_source(paths);
  } catch (const Error& e) {
    // A missing tokenizer does not stop a description of the weights; say why it is absent.
    s.tokenizer_problem = e.what();
  }
  return s;
}

json to_json(const ModelSummary& s) {
  json components = json::array();
  for (const auto& c : s.components) {
    json files = json::array();
    for (const auto& f : c.files) files.push_back(f.string());
    json dtypes = json::object();
    for (const auto& [name, counts] : c.dtypes) dtypes[name] = counts_json(counts);
    json units = json::array();
    for (const auto& u : c.units) {
      json entry = counts_json(u.counts);
      entry["name"] = u.name;
      entry["read_by_inference"] = u.read_by_inference;
      units.push_back(entry);
    }
    json entry = counts_json(c.counts);
    entry["component"] = component_key(c.component);
    entry["layout"] = layout_name(c.layout);
    entry["files"] = files;
    entry["index_file"] = path_or_null(c.index_file);
    entry["config_file"] = path_or_null(c.config_file);
    entry["config_source"] = c.config_file.empty() ? "tensor shapes" : "config file";
    entry["dtypes"] = dtypes;
    entry["units"] = units;
    entry["unused_tensors"] = c.unused;
    components.push_back(entry);
  }
  return json{
      {"name", s.name},
      {"model", path_or_null(s.model)},
      {"config", to_json(s.config)},
      {"components", components},
      {"tokenizer",
       // "dir" also names a GGUF file, whose metadata holds the tokenizer ("source": "gguf").
       {{"dir", s.tokenizer ? json(s.tokenizer->path.string()) : json(nullptr)},
        {"source", s.tokenizer ? json(tokenizer_kind_name(s.tokenizer->kind)) : json(nullptr)},
        {"problem", s.tokenizer_problem.empty() ? json(nullptr) : json(s.tokenizer_problem)}}},
      {"total", counts_json(s.total)},
  };
}

}  // namespace klein
