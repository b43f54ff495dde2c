#include "weights/gguf_source.h"

#include <nlohmann/json.hpp>

#include <map>
#include <string_view>

#include "core/error.h"
#include "tokenizer/tekken.h"
#include "weights/container_store.h"

namespace klein {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// llama.cpp's names of a Qwen3 layer's tensors -> the transformers names (gguf-py's
// tensor_mapping.py, MODEL_TENSOR names of the qwen3 architecture).
struct LayerName {
  const char* gguf;
  const char* hf;
};
constexpr LayerName kQwen3Layer[] = {
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

// A llama.cpp Qwen3 tensor name as transformers spells it; the name itself when it is not
// one (the naming code then reports it as unknown).
std::string qwen3_hf_name(const std::string& name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.rfind("blk.", 0) != 0) return name;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return name;
  const std::string layer = name.substr(4, dot - 4), rest = name.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return name;
  for (const LayerName& n : kQwen3Layer)
    if (rest == n.gguf) return "model.layers." + layer + "." + n.hf;
  return name;
}

// llama.cpp's architectures of Mistral's language models: "llama" (Mistral Small 3.x as
// converted until llama.cpp named it) and "mistral3". Both store q/k rows interleaved.
bool is_llama_architecture(const std::string& arch) { return arch == "llama" || arch == "mistral3"; }

std::string architecture(const gguf::File& file) {
  return file.get_string("general.architecture").value_or("");
}

bool is_float(gguf::TensorType t) {
  return t == gguf::TensorType::F32 || t == gguf::TensorType::F16 || t == gguf::TensorType::BF16;
}

// A tensor's shape, ours: ne reversed, or the shape ComfyUI-GGUF's converter recorded in
// comfy.gguf.orig_shape.NAME (torch order) when it stored the tensor flattened to rows of 256
// elements (for quantizing a matrix whose rows are not whole blocks). The bytes are the same
// run of elements either way; klein reads the original rows only when they are whole blocks.
Shape shape_of(const gguf::File& file, const gguf::TensorInfo& t) {
  const std::string key = "comfy.gguf.orig_shape." + t.name;
  const std::vector<int64_t>* orig = file.value(key) ? file.get_integers(key) : nullptr;
  if (orig == nullptr) return t.shape;
  Shape shape(orig->begin(), orig->end());
  int64_t n = 1;
  for (int64_t d : shape) {
    check(d >= 0 && d < (int64_t(1) << 40), file.path().string(), ": ", key, " holds the dimension ", d);
    n *= d;
  }
  check(n == numel(t.shape), file.path().string(), ": ", key, " ", shape_str(shape), " has ", n,
        " elements but tensor ", t.name, " holds ", numel(t.shape));
  const uint32_t block = gguf::type_info(t.type).block_elems;
  check(shape.empty() || shape.back() % block == 0, file.path().string(), ": tensor ", t.name,
        " is stored flattened (", key, " ", shape_str(shape), ") as ", gguf::type_name(t.type),
        " blocks of ", block, " that straddle its rows of ", shape.empty() ? 0 : shape.back(),
        "; klein cannot read such a tensor yet");
  return shape;
}

}  // namespace

bool is_gguf(const fs::path& path) { return fs::is_regular_file(path) && gguf::looks_like_gguf(path); }

std::vector<NamedShape> gguf_tensor_names(Component c, const gguf::File& file,
                                          std::map<std::string, std::string>& name_in_file) {
  const bool llama_cpp = c == Component::TextEncoder && file.find("token_embd.weight") != nullptr;
  if (llama_cpp) {
    const std::string arch = architecture(file);
    check(arch == "qwen3" || is_llama_architecture(arch), file.path().string(),
          ": general.architecture is \"", arch, "\"; the llama.cpp text encoders klein reads are "
          "qwen3 (FLUX.2-klein, Z-Image) and llama or mistral3 (Mistral Small, FLUX.2-dev)");
  }
  std::vector<NamedShape> out;
  for (const gguf::TensorInfo& t : file.tensors()) {
    const gguf::TypeInfo& info = gguf::type_info(t.type);
    check(info.decodable, file.path().string(), ": tensor ", t.name, " is ", info.name,
          ", a GGML type klein cannot read (it reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, "
          "Q2_K, Q3_K, Q4_K, Q5_K and Q6_K)");
    std::string name = llama_cpp ? qwen3_hf_name(t.name) : t.name;
    name_in_file[name] = t.name;
    out.push_back({std::move(name), shape_of(file, t)});
  }
  return out;
}

int64_t gguf_rope_interleaved_heads(const gguf::File& file, const std::string& hf_name) {
  const std::string arch = architecture(file);
  if (!is_llama_architecture(arch)) return 0;
  const bool q = hf_name.ends_with(".self_attn.q_proj.weight");
  const bool k = hf_name.ends_with(".self_attn.k_proj.weight");
  if (!q && !k) return 0;
  const std::string key = arch + (q ? ".attention.head_count" : ".attention.head_count_kv");
  const std::optional<int64_t> heads = file.get_integer(key);
  check(heads && *heads > 0, file.path().string(), ": ", key,
        " is needed to put the rows of ", hf_name, " back in transformers' order");
  return *heads;
}

GgufTextFacts gguf_text_facts(const gguf::File& file) {
  GgufTextFacts f;
  const std::string arch = architecture(file);
  if (!is_llama_architecture(arch)) return f;
  auto real = [&](const std::string& key) -> std::optional<double> {
    const gguf::Value* v = file.value(key);
    if (!v) return std::nullopt;
    check(v->type == gguf::ValueType::F32 || v->type == gguf::ValueType::F64, file.path().string(),
          ": ", key, " must be a float");
    check(v->real > 0, file.path().string(), ": ", key, " must be positive, not ", v->real);
    return v->real;
  };
  if (auto k = file.get_integer(arch + ".attention.key_length")) {
    check(*k > 0, file.path().string(), ": ", arch, ".attention.key_length must be positive");
    f.head_dim = *k;
  }
  f.rope_theta = real(arch + ".rope.freq_base");
  f.rms_eps = real(arch + ".attention.layer_norm_rms_epsilon");
  return f;
}

Weight gguf_weight(const gguf::File& file, const gguf::TensorInfo& t) {
  Weight w;
  w.name = t.name;
  w.shape = shape_of(file, t);
  w.data = file.data(t);
  w.nbytes = size_t(t.end - t.begin);
  switch (t.type) {
    case gguf::TensorType::F32: w.dtype = DType::F32; break;
    case gguf::TensorType::F16: w.dtype = DType::F16; break;
    case gguf::TensorType::BF16: w.dtype = DType::BF16; break;
    case gguf::TensorType::Q8_0: w.dtype = DType::Q8; break;  // BlockQ8, row-major (layout 0)
    default:
      w.dtype = DType::GGML;
      w.layout = uint8_t(t.type);
  }
  return w;
}

std::string gguf_needs_conversion(const gguf::File& file, const char* option) {
  for (const gguf::TensorInfo& t : file.tensors())
    if (!is_float(t.type))
      return file.path().string() + ": tensor " + t.name + " is " + gguf::type_name(t.type) +
             "; klein runs GGUF files of F32, F16 and BF16 tensors as they are, quantized ones "
             "after converting: convert it first: klein convert " + option + " " + file.path().string() +
             " ... -o model.klein -t q8 (or -t q4)";
  return {};
}

// Mistral's Tekken tokenizer as llama.cpp stores it (tokenizer.ggml.pre "tekken"): the
// tokens by id in the byte-level alphabet, the merges in priority order, control tokens as
// special added tokens; the pre-tokenization pattern is the one that name stands for. It
// becomes the tokenizer.json transformers writes for Tekken (tokenizer/tekken.h).
TokenizerBytes tekken_gguf_tokenizer(const std::vector<std::string>& tokens,
                                     const std::vector<std::string>& merges,
                                     const std::vector<int64_t>* types, const std::string& where) {
  TekkenLayout layout;
  layout.pattern = kTekkenPattern;
  layout.vocab.resize(tokens.size());
  std::map<std::string_view, int64_t> id_of;
  for (size_t id = 0; id < tokens.size(); ++id) {
    const int64_t type = types ? (*types)[id] : 1;
    if (type == 5) continue;  // unused padding
    check(type == 1 || type == 3 || type == 4, where, ": token ", id, " has type ", type,
          " (a byte-level BPE vocabulary has normal, control, user-defined and unused tokens)");
    check(id_of.emplace(tokens[id], int64_t(id)).second, where, ": tokenizer.ggml.tokens holds \"",
          tokens[id], "\" twice");
    layout.vocab[id] = tokens[id];
    if (type != 1) layout.added.push_back({int64_t(id), tokens[id], type == 3});
  }
  layout.merges.reserve(merges.size());
  for (const std::string& m : merges) {
    const size_t space = m.find(' ');
    auto left = space == std::string::npos ? id_of.end() : id_of.find(std::string_view(m).substr(0, space));
    auto right = space == std::string::npos ? id_of.end() : id_of.find(std::string_view(m).substr(space + 1));
    check(left != id_of.end() && right != id_of.end(), where, ": tokenizer.ggml.merges holds \"", m,
          "\", not two tokens of the vocabulary separated by a space");
    layout.merges.emplace_back(left->second, right->second);
  }
  return tekken_layout_files(layout, where + " (tokenizer.ggml.*, Tekken)");
}

TokenizerBytes gguf_tokenizer(const gguf::File& file) {
  const std::string where = file.path().string();
  const auto model = file.get_string("tokenizer.ggml.model");
  check(model.has_value(), where, ": no tokenizer in the metadata (tokenizer.ggml.model); give --tokenizer DIR");
  check(*model == "gpt2", where, ": tokenizer.ggml.model is \"", *model,
        "\"; Qwen3's tokenizer is \"gpt2\" (byte-level BPE)");
  const std::vector<std::string>* tokens = file.get_strings("tokenizer.ggml.tokens");
  const std::vector<std::string>* merges = file.get_strings("tokenizer.ggml.merges");
  const std::vector<int64_t>* types = file.get_integers("tokenizer.ggml.token_type");
  check(tokens != nullptr && merges != nullptr, where,
        ": the tokenizer needs tokenizer.ggml.tokens and tokenizer.ggml.merges");
  check(types == nullptr || types->size() == tokens->size(), where, ": tokenizer.ggml.token_type has ",
        types ? types->size() : 0, " entries for ", tokens->size(), " tokens");
  const std::string pre = file.get_string("tokenizer.ggml.pre").value_or("");
  if (pre == "tekken") return tekken_gguf_tokenizer(*tokens, *merges, types, where);
  check(!is_llama_architecture(architecture(file)), where, ": tokenizer.ggml.pre is \"", pre,
        "\"; of a ", architecture(file), " model klein reads Mistral's tekken tokenizer from the "
        "metadata; give --tokenizer DIR");
  // Token types (llama.cpp's llama_token_type): 1 normal, 2 unknown, 3 control,
  // 4 user-defined, 5 unused, 6 byte.
  json vocab = json::object(), added = json::object();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const int64_t type = types ? (*types)[id] : 1;
    const std::string& text = (*tokens)[id];
    if (type == 1) {
      check(!vocab.contains(text), where, ": tokenizer.ggml.tokens holds \"", text, "\" twice");
      vocab[text] = id;
    } else if (type == 3 || type == 4) {
      added[std::to_string(id)] = {{"content", text}, {"special", type == 3}};
    } else {
      check(type == 5, where, ": token ", id, " has type ", type,
            " (a byte-level BPE vocabulary has normal, control, user-defined and unused tokens)");
    }
  }
  std::string merges_txt = "#version: 0.2\n";
  for (const std::string& m : *merges) {
    check(m.find('\n') == std::string::npos && m.find(' ') != std::string::npos, where,
          ": tokenizer.ggml.merges holds \"", m, "\", not two tokens separated by a space");
    merges_txt += m;
    merges_txt += '\n';
  }
  json config = {{"added_tokens_decoder", added}};
  auto special = [&](const char* key, const char* field) {
    if (auto id = file.get_integer(key); id && *id >= 0 && size_t(*id) < tokens->size())
      config[field] = (*tokens)[size_t(*id)];
  };
  special("tokenizer.ggml.eos_token_id", "eos_token");
  special("tokenizer.ggml.padding_token_id", "pad_token");
  special("tokenizer.ggml.bos_token_id", "bos_token");
  TokenizerBytes out;
  out.origin = where + " (tokenizer.ggml.*)";
  try {
    out.vocab_json = vocab.dump(-1, ' ', false, json::error_handler_t::strict);
    out.tokenizer_config_json = config.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::exception& e) {
    fail(where, ": tokenizer.ggml.tokens holds text that is not UTF-8: ", e.what());
  }
  out.merges_txt = std::move(merges_txt);
  return out;
}

}  // namespace klein
