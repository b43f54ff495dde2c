#include "formats/gguf_files.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "core/files.h"
#include "support/gguf_bytes.h"
#include "support/testing.h"

namespace klein::testing {

namespace {

struct GgmlType {
  uint32_t id;
  int64_t block_elems, block_bytes;  // values per block and its size
};

GgmlType ggml_type(const std::string& dtype) {
  if (dtype == "F32") return {0, 1, 4};
  if (dtype == "F16") return {1, 1, 2};
  if (dtype == "BF16") return {30, 1, 2};
  if (dtype == "Q8_0") return {8, 32, 34};
  if (dtype == "Q4_0") return {2, 32, 18};
  ADD_FAILURE() << "write_gguf: dtype " << dtype;
  return {0, 1, 4};
}

}  // namespace

void write_gguf(const std::filesystem::path& path, const std::vector<GgufKey>& metadata,
                const std::vector<StTensor>& tensors) {
  GgufBytes o;
  o.header(tensors.size(), metadata.size());
  for (const GgufKey& k : metadata) {
    o.str(k.key);
    if (auto* s = std::get_if<std::string>(&k.value)) {
      o.u32(8);
      o.str(*s);
    } else if (auto* u = std::get_if<uint32_t>(&k.value)) {
      o.u32(4);
      o.u32(*u);
    } else if (auto* f = std::get_if<float>(&k.value)) {
      o.u32(6);
      uint32_t bits;
      std::memcpy(&bits, f, 4);
      o.u32(bits);
    } else if (auto* ss = std::get_if<std::vector<std::string>>(&k.value)) {
      o.u32(9);
      o.u32(8);
      o.u64(ss->size());
      for (const auto& s2 : *ss) o.str(s2);
    } else {
      const auto& is = std::get<std::vector<int32_t>>(k.value);
      o.u32(9);
      o.u32(5);
      o.u64(is.size());
      for (int32_t v : is) o.u32(uint32_t(v));
    }
  }
  uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    const GgmlType type = ggml_type(t.dtype);
    // A file whose bytes disagree with its shape would test the reader's errors, not this.
    const bool whole_blocks =
        type.block_elems == 1 || (!t.shape.empty() && t.shape.back() % type.block_elems == 0);
    EXPECT_TRUE(whole_blocks &&
                int64_t(t.bytes.size()) == numel(t.shape) / type.block_elems * type.block_bytes)
        << "write_gguf: " << t.name << " holds " << t.bytes.size() << " bytes for its shape";
    o.tensor(t.name, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), type.id, offset);
    offset = (offset + t.bytes.size() + 31) / 32 * 32;
  }
  o.pad();
  for (const StTensor& t : tensors) {
    o.bytes.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    o.pad();
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out) << "cannot write " << path;
  out.write(o.bytes.data(), std::streamsize(o.bytes.size()));
}

void write_llama_cpp_text_encoder(const std::filesystem::path& path,
                                  const std::function<void(StTensor&)>& transform) {
  std::vector<StTensor> tensors;
  for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"})
    for (StTensor t : read_all(tiny_model() / "text_encoder" / shard)) {
      if (transform) transform(t);
      static const std::vector<std::pair<std::string, std::string>> layer = {
          {"self_attn.q_proj.weight", "attn_q.weight"},
          {"self_attn.k_proj.weight", "attn_k.weight"},
          {"self_attn.v_proj.weight", "attn_v.weight"},
          {"self_attn.o_proj.weight", "attn_output.weight"},
          {"self_attn.q_norm.weight", "attn_q_norm.weight"},
          {"self_attn.k_norm.weight", "attn_k_norm.weight"},
          {"input_layernorm.weight", "attn_norm.weight"},
          {"post_attention_layernorm.weight", "ffn_norm.weight"},
          {"mlp.gate_proj.weight", "ffn_gate.weight"},
          {"mlp.up_proj.weight", "ffn_up.weight"},
          {"mlp.down_proj.weight", "ffn_down.weight"}};
      std::smatch m;
      static const std::regex re(R"(^model\.layers\.(\d+)\.(.*)$)");
      if (t.name == "lm_head.weight") continue;  // tied: llama.cpp writes no output.weight
      if (t.name == "model.embed_tokens.weight") {
        t.name = "token_embd.weight";
      } else if (t.name == "model.norm.weight") {
        t.name = "output_norm.weight";
      } else {
        ASSERT_TRUE(std::regex_match(t.name, m, re)) << t.name;
        std::string to;
        for (const auto& [hf, gg] : layer)
          if (m[2] == hf) to = gg;
        ASSERT_FALSE(to.empty()) << t.name;
        t.name = "blk." + m[1].str() + "." + to;
      }
      tensors.push_back(std::move(t));
    }
  const std::filesystem::path dir = tiny_model() / "tokenizer";
  const auto vocab = nlohmann::json::parse(read_text_file(dir / "vocab.json"));
  const auto config = nlohmann::json::parse(read_text_file(dir / "tokenizer_config.json"));
  const size_t size = 151936;
  std::vector<std::string> tokens(size);
  std::vector<int32_t> types(size, 5);
  for (size_t i = 0; i < size; ++i) tokens[i] = "[PAD" + std::to_string(i) + "]";
  for (const auto& [text, id] : vocab.items()) {
    tokens[id.get<size_t>()] = text;
    types[id.get<size_t>()] = 1;
  }
  for (const auto& [id, t] : config["added_tokens_decoder"].items()) {
    tokens[std::stoul(id)] = t["content"].get<std::string>();
    types[std::stoul(id)] = t["special"].get<bool>() ? 3 : 4;
  }
  std::vector<std::string> merges;
  const std::string text = read_text_file(dir / "merges.txt");
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    if (!line.empty() && line[0] != '#') merges.push_back(line);
    at = end + 1;
  }
  write_gguf(path,
             {{"general.architecture", std::string("qwen3")},
              {"tokenizer.ggml.model", std::string("gpt2")},
              {"tokenizer.ggml.tokens", tokens},
              {"tokenizer.ggml.token_type", types},
              {"tokenizer.ggml.merges", merges},
              {"tokenizer.ggml.eos_token_id", uint32_t(151645)}},
             tensors);
}

}  // namespace klein::testing
