#include "convert/inspect.h"

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "convert/policy.h"
#include "core/error.h"
#include "core/json_fields.h"
#include "core/memory.h"
#include "quant/matmul.h"
#include "weights/config.h"
#include "weights/container_store.h"
#include "weights/family.h"

namespace klein::convert {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

double bits_per_weight(uint64_t bytes, uint64_t params) {
  return params ? double(bytes) * 8.0 / double(params) : 0.0;
}

std::string layout_label(DType type, uint8_t layout) {
  if (dtype_is_float(type) && layout == 0) return "row-major";
  if (layout > uint8_t(quant::Layout::Interleaved16)) return "layout " + std::to_string(layout);
  return std::string(quant::layout_name(quant::Layout(layout)));
}

struct Totals {
  uint64_t tensors = 0, params = 0, bytes = 0;
  void add(uint64_t p, uint64_t b) {
    ++tensors;
    params += p;
    bytes += b;
  }
  json to_json() const {
    return {{"tensors", tensors},
            {"parameters", params},
            {"bytes", bytes},
            {"bits_per_weight", bits_per_weight(bytes, params)}};
  }
};

std::string human_bytes(uint64_t n) { return format_decimal_bytes(n, 2); }

// A network stored beside the model under `key`: "yes (SOURCE: SUMMARY, BYTES; USE)".
std::string stored_network(const container::ContainerFile& file, const std::string& key,
                           const json& meta, const std::string& use) {
  uint64_t bytes = 0;
  for (const auto& u : file.index().units)
    if (u.name.rfind(key + ".", 0) == 0)
      for (const auto& t : file.tensors_of(u)) bytes += t.size;
  const std::string where = file.path().string() + ": metadata \"" + key + "\"";
  std::string source = "?", summary = "?";
  read_json_field(meta, "source", source, where);
  read_json_field(meta, "summary", summary, where);
  return "yes (" + source + ": " + summary + ", " + human_bytes(bytes) + "; " + use + ")";
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

json describe_container(const fs::path& path, bool tensors) {
  const container::ContainerFile file(path);
  const auto& h = file.header();
  const auto& meta = file.metadata();
  json d;
  d["file"] = path.string();
  d["format_version"] = std::to_string(h.major) + "." + std::to_string(h.minor);
  d["file_bytes"] = h.file_size;
  d["alignment"] = h.alignment;
  d["header_xxh3"] = container::hex64(h.header_xxh3);
  d["metadata_bytes"] = {{"compressed", h.metadata_size}, {"json", h.metadata_raw_size}};
  d["index_bytes"] = h.index_size;

  Totals all;
  std::map<std::string, Totals> by_type;
  json units = json::array();
  json tensor_list = json::array();
  for (const auto& u : file.index().units) {
    Totals ut;
    std::map<std::string, uint64_t> types;
    for (const auto& t : file.tensors_of(u)) {
      const uint64_t params = uint64_t(numel(t.shape));
      const std::string type = storage_type_name(t.type);
      ut.add(params, t.size);
      all.add(params, t.size);
      by_type[type].add(params, t.size);
      ++types[type];
      if (tensors)
        tensor_list.push_back({{"name", t.name},
                               {"unit", u.name},
                               {"type", type},
                               {"layout", layout_label(t.type, t.layout)},
                               {"block_size", t.block_size},
                               {"shape", t.shape},
                               {"offset", t.offset},
                               {"bytes", t.size},
                               {"bits_per_weight", bits_per_weight(t.size, params)},
                               {"xxh3", container::hex64(t.xxh3)}});
    }
    json uj = ut.to_json();
    uj["name"] = u.name;
    uj["offset"] = u.offset;
    uj["span_bytes"] = u.size;
    uj["types"] = types;
    uj["xxh3"] = container::hex64(u.xxh3);
    units.push_back(uj);
  }
  d["total"] = all.to_json();
  json types = json::object();
  for (const auto& [name, t] : by_type) types[name] = t.to_json();
  d["by_type"] = types;
  d["units"] = units;
  if (tensors) d["tensors"] = tensor_list;
  if (meta.contains("config")) d["config"] = meta["config"];
  // Prompt upsampling runs the text encoder as a language model: every layer and the final
  // norm (`convert --keep-llm`; an untied lm_head comes with them).
  {
    std::set<std::string> names;
    for (const auto& u : file.index().units) names.insert(u.name);
    int64_t layers = -1;
    if (meta.contains("config") && meta["config"].contains("text_encoder"))
      layers = meta["config"]["text_encoder"].value("num_hidden_layers", int64_t(-1));
    bool all = layers > 0 && names.count("text_encoder.norm") && names.count("text_encoder.embed");
    for (int64_t l = 0; all && l < layers; ++l)
      all = names.count("text_encoder.layer." + std::to_string(l)) > 0;
    d["can_upsample"] = all;
  }
  // The safety classifier stored beside the model (convert --safety-model).
  if (meta.contains("safety") && meta["safety"].is_object()) {
    const json& s = meta["safety"];
    const std::string where = path.string() + ": metadata \"safety\"";
    const json c = s.contains("config") && s["config"].is_object() ? s["config"] : json::object();
    std::string source = "?";
    int64_t layers = 0, hidden = 0;
    read_json_field(s, "source", source, where);
    read_json_field(c, "num_hidden_layers", layers, where + ".config");
    read_json_field(c, "hidden_size", hidden, where + ".config");
    uint64_t bytes = 0;
    for (const auto& u : file.index().units)
      if (u.name.rfind("safety.", 0) == 0)
        for (const auto& t : file.tensors_of(u)) bytes += t.size;
    d["safety_classifier"] = "yes (" + source + ": ViT, " + std::to_string(layers) +
                             " layers, hidden " + std::to_string(hidden) + ", " +
                             human_bytes(bytes) + "; generate --safety and serve use it)";
  }
  // A control model and the tiny autoencoder's decoder stored beside the model (convert
  // --controlnet, --tiny-vae).
  for (const auto& [key, field, use] :
       {std::tuple{"controlnet", "control_model", "generate --control-image and serve use it"},
        std::tuple{"tiny_vae", "tiny_decoder", "previews and generate --decoder tiny use it"}})
    if (meta.contains(key) && meta[key].is_object())
      d[field] = stored_network(file, key, meta[key], use);
  if (meta.contains("conversion")) d["conversion"] = meta["conversion"];
  json tok = json::object();
  if (meta.contains("tokenizer") && meta["tokenizer"].is_object())
    for (const auto& [name, text] : meta["tokenizer"].items())
      tok[name] = {{"bytes", text.is_string() ? text.get<std::string>().size() : 0}};
  d["tokenizer"] = tok;
  return d;
}

std::string describe_container_text(const json& d) {
  std::string s;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line("container: " + d["file"].get<std::string>() + " (format " +
       d["format_version"].get<std::string>() + ", " + human_bytes(d["file_bytes"]) +
       ", units aligned to " + std::to_string(d["alignment"].get<uint64_t>() >> 10) + " KiB)");
  const json& total = d["total"];
  line("  " + std::to_string(total["tensors"].get<uint64_t>()) + " tensors, " +
       std::to_string(total["parameters"].get<uint64_t>()) + " parameters, " +
       human_bytes(total["bytes"]) + ", " + fmt("%.2f", total["bits_per_weight"]) +
       " bits per weight");
  line("  checksum (identity): " + d["header_xxh3"].get<std::string>());
  if (d.contains("safety_classifier"))
    line("  safety classifier: " + d["safety_classifier"].get<std::string>());
  if (d.contains("control_model"))
    line("  control model: " + d["control_model"].get<std::string>());
  if (d.contains("tiny_decoder"))
    line("  tiny decoder: " + d["tiny_decoder"].get<std::string>());
  if (d.contains("can_upsample"))
    line(d["can_upsample"].get<bool>()
             ? "  prompt upsampling: yes (the whole text encoder and its head are kept)"
             : "  prompt upsampling: no (convert with --keep-llm to keep the text encoder's "
               "later layers and head)");
  if (d.contains("config")) {
    const json& c = d["config"];
    const json& e = c["text_encoder"];
    const ModelConfig config = model_config_from_json(c, "the container's configuration");
    const ModelFamily& family = model_family(config);
    const std::string variant = variant_name(config);
    line("model: " + config.name + " (" + std::string(family.title()) + ")" +
         (variant.empty() ? "" : ", variant " + variant));
    for (const std::string& l : family.describe_pipeline(config)) line("  " + l);
    line("  transformer: " + family.describe_transformer(config));
    line(std::string("  text encoder: ") +
         (config.text_encoder.qk_norm ? "Qwen3" : "Mistral (language model)") + ", hidden " +
         std::to_string(e["hidden_size"].get<int64_t>()) + ", " +
         std::to_string(e["num_hidden_layers"].get<int64_t>()) + " layers in the checkpoint");
  }
  line("storage types:");
  for (const auto& [type, t] : d["by_type"].items())
    line("  " + type + std::string(6 - std::min<size_t>(type.size(), 5), ' ') +
         std::to_string(t["tensors"].get<uint64_t>()) + " tensors, " + human_bytes(t["bytes"]) +
         ", " + fmt("%.2f", t["bits_per_weight"]) + " bits per weight");
  line("units (file order):");
  for (const auto& u : d["units"]) {
    std::string types;
    for (const auto& [type, n] : u["types"].items())
      types += (types.empty() ? "" : " ") + type + "x" + std::to_string(n.get<uint64_t>());
    char buf[256];
    std::snprintf(buf, sizeof buf, "  %-26s %4llu tensors %11s %6.2f bpw  %s",
                  u["name"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(u["tensors"].get<uint64_t>()),
                  human_bytes(u["bytes"]).c_str(), u["bits_per_weight"].get<double>(),
                  types.c_str());
    line(buf);
  }
  if (d.contains("conversion")) {
    const json& r = d["conversion"];
    line("conversion: " + r.value("program", std::string("?")) + " " +
         r.value("version", std::string("?")) + ", " + r.value("date", std::string("?")) +
         ", target " + r.value("target_type", std::string("?")) +
         (r.contains("policy_file") && r["policy_file"].is_string()
              ? ", policy " + r["policy_file"].get<std::string>()
              : std::string(", default policy")));
    if (r.contains("sources"))
      for (const auto& f : r["sources"])
        line("  source " + f.value("file", std::string("?")) + " (" +
             std::to_string(f.value("bytes", uint64_t(0))) + " bytes, xxh3 " +
             f.value("xxh3", std::string("?")) + ")");
    if (r.contains("dropped") && !r["dropped"].empty())
      line("  dropped " + std::to_string(r["dropped"].size()) +
           " tensors never read by inference (see --json)");
    if (r.contains("fallbacks"))
      for (const auto& f : r["fallbacks"])
        line("  " + f.value("tensor", std::string("?")) + ": stored as " +
             f.value("stored", std::string("?")) + " instead of " +
             f.value("wanted", std::string("?")) + " (" + f.value("reason", std::string("?")) +
             ")");
  }
  std::string tok;
  for (const auto& [name, t] : d["tokenizer"].items())
    tok += (tok.empty() ? "" : ", ") + name + " (" + std::to_string(t["bytes"].get<uint64_t>()) +
           " bytes)";
  line("tokenizer: " + (tok.empty() ? std::string("none") : tok));
  return s;
}

VerifyOutcome verify_model_container(const fs::path& path,
                                     const std::function<void(size_t, size_t)>& progress) {
  VerifyOutcome out;
  // Header, index, metadata: thrown when wrong.
  const container::ContainerFile file(path);
  try {
    ContainerOptions o;
    o.check_units = false;
    ContainerStore store(path, o);
  } catch (const Error& e) {
    out.model.push_back(e.what());
  }
  out.data = container::verify_container(file, progress);
  return out;
}

}  // namespace klein::convert
