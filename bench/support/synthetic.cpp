#include "bench/support/synthetic.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/files.h"
#include "formats/safetensors_writer.h"
#include "weights/expected.h"
#include "weights/family.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

// splitmix64: seeds a per-tensor xoshiro-style stream from (seed, name).
uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& name) {  // FNV-1a
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Values of unit variance, uniform on [-sqrt 3, sqrt 3]: cheap, and enough for timing runs.
class UnitUniform {
 public:
  UnitUniform(uint64_t seed, const std::string& name) {
    uint64_t s = seed ^ name_hash(name);
    for (auto& w : state_) w = splitmix(s);
  }
  float next() {  // xoshiro256+
    const uint64_t result = state_[0] + state_[3];
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = (state_[3] << 45) | (state_[3] >> 19);
    const float unit = float(result >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * unit - 1.0f) * 1.7320508f;
  }

 private:
  uint64_t state_[4];
};


// value = offset + scale * u, per the rules in synthetic.h.
struct Rule {
  float offset, scale;
  bool exponential = false;
};

Rule rule_for(const std::string& name, const Shape& shape) {
  const bool is_norm_q_k = name.find("norm_q") != std::string::npos ||
                           name.find("norm_k") != std::string::npos ||
                           name.find("norm_added_") != std::string::npos ||
                           name.find("q_norm") != std::string::npos ||
                           name.find("k_norm") != std::string::npos;
  if (name.ends_with("running_mean")) return {0.f, 0.3f};
  if (name.ends_with("running_var")) return {0.f, 0.4f, true};
  if (name.find("embed_tokens") != std::string::npos) return {0.f, 0.5f};
  if (shape.size() == 1) {
    if (name.ends_with(".bias")) return {0.f, 0.02f};
    if (is_norm_q_k) return {1.8f, 0.18f};
    return {1.f, 0.1f};
  }
  float fan_in = 1;
  for (size_t i = 1; i < shape.size(); ++i) fan_in *= float(shape[i]);
  float gain = 1;
  if (name.find("modulation") != std::string::npos || name.find("norm_out.linear") != std::string::npos)
    gain = 2;
  if (name.find("decoder.conv_out") != std::string::npos) gain = 0.5f;
  return {0.f, gain / std::sqrt(fan_in)};
}

// n values of the rule from the generator, as bf16.
void fill_bf16(const Rule& r, UnitUniform& rng, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v = r.offset + r.scale * rng.next();
    if (r.exponential) v = std::exp(v);
    out[i] = f32_to_bf16(v);
  }
}

// Streams one tensor's random values as bf16 (or i64 zeros for the batch counter).
void write_tensor(SafetensorsWriter& w, const SafetensorsDecl& d, uint64_t seed) {
  if (d.dtype == DType::I64) {
    const std::vector<int64_t> zeros(size_t(numel(d.shape)), 0);
    w.write(zeros.data(), zeros.size() * 8);
    return;
  }
  const Rule r = rule_for(d.name, d.shape);
  UnitUniform rng(seed, d.name);
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint16_t> buf;
  for (int64_t done = 0, n = numel(d.shape); done < n; done += kChunk) {
    const int64_t m = std::min(kChunk, n - done);
    buf.resize(size_t(m));
    fill_bf16(r, rng, buf.data(), m);
    w.write(buf.data(), buf.size() * 2);
  }
}

std::vector<SafetensorsDecl> decls_from(const ShapeMap& shapes, const std::string& strip) {
  std::vector<SafetensorsDecl> out;
  for (const auto& [name, shape] : shapes) out.push_back({name.substr(strip.size()), DType::BF16, shape});
  return out;
}

void write_file(const fs::path& path, std::vector<SafetensorsDecl> decls, uint64_t seed,
                uint64_t& done, uint64_t total, const SyntheticProgress& progress) {
  SafetensorsWriter w(path, std::move(decls), {{"format", "pt"}});
  for (const auto& d : w.tensors()) {
    write_tensor(w, d, seed);
    done += d.nbytes();
    if (progress) progress(path.filename().string(), done, total);
  }
  w.finish();
}

void write_json(const fs::path& path, const json& j) {
  AtomicFile f(path);
  f.write(j.dump(2) + "\n");
  f.commit();
}

json diffusers_config(const char* cls, const nlohmann::json& fields) {
  json j;
  j["_class_name"] = cls;
  j["_diffusers_version"] = "0.36.0";
  for (auto& [k, v] : fields.items()) j[k] = v;
  return j;
}

}  // namespace

ModelConfig klein_variant_config(const std::string& variant) {
  std::string known;
  for (const ModelFamily* f : model_families())
    for (const auto& m : f->published_models()) {
      if (m.name == variant) return f->published_config(variant);
      known += (known.empty() ? "" : ", ") + m.name;
    }
  const size_t last = known.rfind(", ");
  if (last != std::string::npos) known.replace(last, 2, " or ");
  fail("variant ", variant, ": expected ", known);
}

void write_synthetic_model(const SyntheticModelOptions& o, const SyntheticProgress& progress) {
  const fs::path& dir = o.out_dir;
  check(!fs::exists(dir) || fs::is_empty(dir), dir.string(), " exists and is not empty");
  // The files are written in Qwen3's text-encoder layout (Qwen3ForCausalLM); Mistral3's
  // (FLUX.2-dev) is not written, and its BF16 files would be about 100 GB anyway.
  check(o.config.text_encoder.qk_norm, "a synthetic model with a Mistral text encoder "
        "(FLUX.2-dev) is made straight into a container: give -t q4 (or another storage "
        "type); its BF16 files would be about 100 GB");
  // The slow layout needs all three files (tokenizer_config.json has the special tokens);
  // tokenizer.json holds everything.
  if (!fs::exists(o.tokenizer_dir / "tokenizer.json"))
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
      check(fs::exists(o.tokenizer_dir / f), "--tokenizer ", o.tokenizer_dir.string(), ": no ", f,
            " (nor tokenizer.json)");
  for (const char* sub : {"transformer", "text_encoder", "vae", "tokenizer", "scheduler"})
    fs::create_directories(dir / sub);

  const ModelConfig& c = o.config;
  const nlohmann::json cfg = to_json(c);
  ShapeMap text = expected_text_encoder(c.text_encoder);
  // The published encoder has every layer and the final norm, though inference stops early.
  TextEncoderConfig all_layers = c.text_encoder;
  all_layers.output_layers = {c.text_encoder.num_layers};
  text = expected_text_encoder(all_layers);
  text["text_encoder.model.norm.weight"] = {c.text_encoder.hidden};

  const ModelFamily& family = model_family(c);
  auto tdecls = decls_from(expected_tensors(c, Component::Transformer), "transformer.");
  auto vdecls = decls_from(expected_vae(c.vae), "vae.");
  if (c.vae.latent_batch_norm) vdecls.push_back({"bn.num_batches_tracked", DType::I64, {}});
  // Two text-encoder shards split by layer, as the published checkpoint is.
  std::vector<SafetensorsDecl> shard1, shard2;
  for (auto& d : decls_from(text, "text_encoder.")) {
    int64_t layer = -1;
    if (d.name.rfind("model.layers.", 0) == 0) layer = std::stoll(d.name.substr(13));
    (layer >= c.text_encoder.num_layers / 2 || d.name == "model.norm.weight" ? shard2 : shard1)
        .push_back(d);
  }
  uint64_t total = 0, done = 0;
  for (const auto* list : {&tdecls, &vdecls, &shard1, &shard2})
    for (const auto& d : *list) total += d.nbytes();

  write_json(dir / "model_index.json", family.diffusers_model_index(c));
  write_json(dir / "transformer" / "config.json",
             diffusers_config(family.diffusers_transformer_class().c_str(), cfg["transformer"]));
  write_json(dir / "vae" / "config.json",
             diffusers_config(c.vae.latent_batch_norm ? "AutoencoderKLFlux2" : "AutoencoderKL",
                              cfg["vae"]));
  json sched = diffusers_config("FlowMatchEulerDiscreteScheduler", cfg["scheduler"]);
  sched["base_image_seq_len"] = 256;
  sched["max_image_seq_len"] = 4096;
  sched["base_shift"] = 0.5;
  sched["max_shift"] = 1.15;
  write_json(dir / "scheduler" / "scheduler_config.json", sched);
  json te = cfg["text_encoder"];
  te["architectures"] = {"Qwen3ForCausalLM"};
  te["hidden_act"] = "silu";
  te["tie_word_embeddings"] = true;
  te["torch_dtype"] = "bfloat16";
  te["max_position_embeddings"] = 40960;
  te["attention_bias"] = false;
  te["bos_token_id"] = 151643;
  te["eos_token_id"] = 151645;
  write_json(dir / "text_encoder" / "config.json", te);

  write_file(dir / "vae" / "diffusion_pytorch_model.safetensors", vdecls, o.seed, done, total, progress);
  json weight_map;
  uint64_t text_bytes = 0;
  const char* shard_names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  for (int s = 0; s < 2; ++s)
    for (const auto& d : (s == 0 ? shard1 : shard2)) {
      weight_map[d.name] = shard_names[s];
      text_bytes += d.nbytes();
    }
  write_json(dir / "text_encoder" / "model.safetensors.index.json",
             json{{"metadata", {{"total_size", text_bytes}}}, {"weight_map", weight_map}});
  write_file(dir / "text_encoder" / shard_names[0], shard1, o.seed, done, total, progress);
  write_file(dir / "text_encoder" / shard_names[1], shard2, o.seed, done, total, progress);
  write_file(dir / "transformer" / "diffusion_pytorch_model.safetensors", tdecls, o.seed, done,
             total, progress);
  for (const auto& entry : fs::directory_iterator(o.tokenizer_dir))
    if (entry.is_regular_file())
      fs::copy_file(entry.path(), dir / "tokenizer" / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
}

namespace {

class SyntheticUnit final : public WeightUnit {
 public:
  SyntheticUnit(const std::string& name, const std::string& prefix) : WeightUnit(name, prefix) {}
  using WeightUnit::add;
  std::vector<std::vector<uint16_t>> owned;  // bf16 values
};

constexpr int64_t kPiece = int64_t(1) << 20;

}  // namespace

SyntheticStore::SyntheticStore(ModelConfig config, uint64_t seed, int threads)
    : config_(std::move(config)), seed_(seed), pool_(std::make_unique<ThreadPool>(threads)) {
  const ModelFamily& family = model_family(config_);
  ShapeMap all = expected_tensors(config_, Component::Transformer);
  for (const auto& [n, s] : expected_text_encoder(config_.text_encoder)) all[n] = s;
  for (const auto& [n, s] : expected_vae(config_.vae)) all[n] = s;
  for (const auto& [name, shape] : all) {
    const auto u = unit_of(family, name);
    check(u.has_value(), "internal: synthetic tensor ", name, " belongs to no unit");
    Planned& p = units_[u->unit];
    p.prefix = u->prefix;
    p.tensors.emplace_back(name, shape);
  }
}

SyntheticStore::~SyntheticStore() = default;

std::vector<std::string> SyntheticStore::units() const {
  std::vector<std::string> out;
  for (const auto& [name, p] : units_) out.push_back(name);
  return out;
}

std::string SyntheticStore::identity() const {
  return "synthetic " + config_.family + " seed " + std::to_string(seed_);
}

uint64_t SyntheticStore::unit_bytes(const std::string& unit) const {
  auto it = units_.find(unit);
  if (it == units_.end()) return 0;
  uint64_t n = 0;
  for (const auto& [name, shape] : it->second.tensors) n += uint64_t(numel(shape)) * 2;
  return n;
}

UnitRef SyntheticStore::acquire(const std::string& unit) { return make(unit, true); }

UnitRef SyntheticStore::describe(const std::string& unit) { return make(unit, false); }

UnitRef SyntheticStore::make(const std::string& unit, bool values_wanted) {
  auto it = units_.find(unit);
  check(it != units_.end(), "the synthetic model has no weight unit ", unit);
  auto u = std::make_shared<SyntheticUnit>(unit, it->second.prefix);
  for (const auto& [name, shape] : it->second.tensors) {
    const int64_t n = numel(shape);
    if (!values_wanted) {
      Weight w;
      w.name = name;
      w.dtype = DType::BF16;
      w.shape = shape;
      w.nbytes = size_t(n) * 2;
      u->add(std::move(w));
      continue;
    }
    std::vector<uint16_t> values(static_cast<size_t>(n));
    const Rule r = rule_for(name, shape);
    const std::string& tensor = name;  // (a structured binding cannot be captured in C++20)
    const int64_t pieces = (n + kPiece - 1) / kPiece;
    pool_->parallel_for(pieces, [&](int64_t b, int64_t e, int) {
      for (int64_t k = b; k < e; ++k) {
        UnitUniform rng(seed_, tensor + "#" + std::to_string(k));
        fill_bf16(r, rng, values.data() + k * kPiece, std::min(n, (k + 1) * kPiece) - k * kPiece);
      }
    });
    u->owned.push_back(std::move(values));
    Weight w;
    w.name = name;
    w.dtype = DType::BF16;
    w.shape = shape;
    w.data = u->owned.back().data();
    w.nbytes = size_t(n) * 2;
    u->add(std::move(w));
  }
  return u;
}

}  // namespace klein
