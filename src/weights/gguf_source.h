#pragma once
// GGUF files as sources of a model component: ComfyUI-GGUF and stable-diffusion.cpp
// transformers (BFL names, with or without the "model.diffusion_model." prefix: the naming
// code strips it), and llama.cpp's Qwen3 text encoders (token_embd, blk.N.attn_q, ...,
// output_norm), whose tokenizer lives in the metadata (tokenizer.ggml.*).
//
// What a GGUF tensor becomes as a weight: F32, F16 and BF16 as they are; Q8_0 as our Q8 in
// the row-major layout (the blocks are byte for byte BlockQ8: an f16 scale and 32 int8, see
// quant/blocks.h); every other readable type as DType::GGML with the GGML type id in the
// layout byte, which only `klein convert` reads (decoded to float32 row by row).
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "weights/naming.h"
#include "weights/weight_store.h"

namespace klein {

struct TokenizerBytes;

bool is_gguf(const std::filesystem::path& path);

// The tensors of a GGUF file under the names the naming code reads for component `c`
// (llama.cpp's Qwen3 names become the transformers names), and for each such name the
// tensor's name in the file. A tensor of a type the engine cannot read is an error naming
// the file, tensor and type.
std::vector<NamedShape> gguf_tensor_names(Component c, const gguf::File& file,
                                          std::map<std::string, std::string>& name_in_file);

// For a llama.cpp text encoder of a llama-architecture model (general.architecture llama or
// mistral3: Mistral Small's GGUFs), the number of heads over which the converter interleaved
// the rows of canonical tensor `hf_name` (q_proj: attention.head_count, k_proj:
// attention.head_count_kv; see TensorSource::rope_interleaved_heads); 0 for any other.
int64_t gguf_rope_interleaved_heads(const gguf::File& file, const std::string& hf_name);

// What the metadata of a llama-architecture text encoder says that its weights do not show
// ({arch}.attention.key_length, .rope.freq_base, .attention.layer_norm_rms_epsilon); each
// absent for a key that is absent, all absent for other architectures.
struct GgufTextFacts {
  std::optional<int64_t> head_dim;
  std::optional<double> rope_theta;
  std::optional<double> rms_eps;
};
GgufTextFacts gguf_text_facts(const gguf::File& file);

// A GGUF tensor as weight bytes (dtype, shape, data, layout; see above).
Weight gguf_weight(const gguf::File& file, const gguf::TensorInfo& t);

// When a GGUF source holds tensors the engine computes with only after converting (anything
// but F32/F16/BF16): the message saying so and how to convert; empty otherwise.
std::string gguf_needs_conversion(const gguf::File& file, const char* option);

// The tokenizer a llama.cpp text-encoder GGUF carries (tokenizer.ggml.model "gpt2": the
// byte-level BPE tokens in id order, their types and the merges) as the files Qwen3 ships:
// vocab.json (NORMAL tokens), merges.txt, and tokenizer_config.json with the added tokens
// (CONTROL: special; USER_DEFINED: not special; UNUSED padding left out). Mistral's
// (tokenizer.ggml.pre "tekken") becomes the tokenizer.json transformers writes for it
// (tokenizer/tekken.h); another pre-tokenizer of a llama-architecture model is refused.
TokenizerBytes gguf_tokenizer(const gguf::File& file);

}  // namespace klein
