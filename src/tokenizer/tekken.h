#pragma once
// Mistral's own tokenizer file, tekken.json (mistral_common's Tekkenizer): a tiktoken-style
// byte-level BPE written as byte strings in rank order, the special tokens ahead of them, and
// the pre-tokenization regex. Mistral's repositories ship it as tekken.json; single-file
// Mistral text encoders (ComfyUI's FLUX.2-dev files) carry its bytes in a U8 tensor named
// "tekken_model".
//
// What is read:
//   {"config": {"pattern": P, "default_vocab_size": V, "default_num_special_tokens": S, ...},
//    "vocab": [{"rank": r, "token_bytes": BASE64, "token_str": ...}, ...]      rank order
//    "special_tokens": [{"rank": i, "token_str": "<unk>", "is_control": true}, ...]}
// Ids: special token i is id i (a rank below S without an entry is "<SPECIAL_i>"); the regular
// token of rank r is id S + r, and only the first V - S regular tokens are in the vocabulary.
//
// It is turned into the tokenizer.json transformers' Tekken converter writes for the same
// file, which the Tokenizer then reads (tokenizer/tokenizer.h):
//   vocabulary   the special tokens under their names, the regular ones in the byte-level
//                alphabet;
//   merges       for each regular token in rank order, one merge per cut into two regular
//                tokens, those of one token ordered by the ranks of the two halves: parts are
//                joined in the order of the rank of the token they make, as tiktoken does;
//   model        BPE with ignore_merges (a piece that is a token as a whole is that token);
//   pre_tokenizer the file's pattern as a Split ("Isolated"), then ByteLevel without a regex;
//   added tokens every special token, special;
// and a tokenizer_config.json that pads on the left (LlamaTokenizerFast's side, the class
// transformers gives Mistral's converted tokenizers).
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace klein {

// The tokenizer files of a tekken.json's contents; errors name `origin` and the field.
TokenizerBytes tekken_tokenizer(std::string_view tekken_json, const std::string& origin);

// The pre-tokenization regex of Mistral's Tekken tokenizers (the config.pattern of their
// tekken.json, and the pattern llama.cpp names "tekken" in a GGUF's tokenizer.ggml.pre):
// letters split by case class, digits one by one.
inline constexpr const char* kTekkenPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"(|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// What a tokenizer.json of the converter's layout holds, from wherever it was read (a
// tekken.json, a GGUF's tokenizer.ggml.*): the tokens by id in the byte-level alphabet (an
// empty string: no token at that id), merges as pairs of ids in priority order, the added
// tokens, and the Split pattern. tekken_layout_files writes it as that tokenizer.json (BPE
// with ignore_merges, no normaliser) and a tokenizer_config.json that pads on the left.
struct TekkenLayout {
  struct Added {
    int64_t id;
    std::string content;
    bool special;
  };
  std::vector<std::string> vocab;
  std::vector<std::pair<int64_t, int64_t>> merges;
  std::vector<Added> added;
  std::string pattern;
};
TokenizerBytes tekken_layout_files(const TekkenLayout& layout, const std::string& origin);

// The name of the tensor that carries a tekken.json inside a single-file text encoder.
inline constexpr const char* kTekkenTensor = "tekken_model";

}  // namespace klein
