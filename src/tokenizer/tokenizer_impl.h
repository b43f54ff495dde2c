#pragma once
// Internal: the state behind klein::Tokenizer, shared by the loader (tokenizer_load.cpp)
// and the encoder/decoder (tokenizer.cpp). Not part of the public interface.
#include <array>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace klein {

struct Tokenizer::Impl {
  tok::BpeModel bpe;
  bool nfc = true;                 // normalizer: NFC (Qwen2's), or none (null)
  tok::Pretokenizer pretokenizer;  // Qwen2's pattern unless tokenizer.json names another

  std::vector<AddedToken> added;  // sorted by id
  bool pads_left = false;         // tokenizer_config.json: "padding_side": "left"
  std::unordered_map<int32_t, size_t> added_by_id;
  std::unordered_map<std::string, size_t> added_by_content;
  // For the left-to-right scan: the added tokens that start with a given byte, longest
  // first, so the first one that matches is the longest match at that position.
  std::array<std::vector<size_t>, 256> added_by_first_byte;

  // Fills the three indexes above from `added`.
  void index_added_tokens();
  const AddedToken* find_added(int32_t id) const;
  // The longest added token that starts at text[pos], or nullptr.
  const AddedToken* added_token_at(std::string_view text, size_t pos) const;
  // One stretch of text between added tokens: normalise (if NFC), pre-tokenize, BPE every
  // piece.
  void encode_segment(std::string_view segment, std::vector<int32_t>& ids,
                      tok::BpeModel::Scratch& scratch) const;
};

}  // namespace klein
