// Encoding and decoding (loading is in tokenizer_load.cpp).
#include <algorithm>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace klein {

void Tokenizer::Impl::index_added_tokens() {
  added_by_id.clear();
  added_by_content.clear();
  for (auto& list : added_by_first_byte) list.clear();
  for (size_t i = 0; i < added.size(); ++i) {
    added_by_id.emplace(added[i].id, i);
    added_by_content.emplace(added[i].content, i);
    added_by_first_byte[uint8_t(added[i].content[0])].push_back(i);
  }
  for (auto& list : added_by_first_byte)
    std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
      return added[a].content.size() > added[b].content.size();
    });
}

const AddedToken* Tokenizer::Impl::find_added(int32_t id) const {
  auto it = added_by_id.find(id);
  return it == added_by_id.end() ? nullptr : &added[it->second];
}

const AddedToken* Tokenizer::Impl::added_token_at(std::string_view text, size_t pos) const {
  for (size_t i : added_by_first_byte[uint8_t(text[pos])]) {
    const AddedToken& t = added[i];
    if (text.compare(pos, t.content.size(), t.content) == 0) return &t;
  }
  return nullptr;
}

void Tokenizer::Impl::encode_segment(std::string_view segment, std::vector<int32_t>& ids,
                                     tok::BpeModel::Scratch& scratch) const {
  if (segment.empty()) return;
  auto encode_piece = [&](std::string_view piece) { bpe.encode_piece(piece, ids, scratch); };
  // Without a normaliser the text is split as it is (the regex checks that it is UTF-8).
  if (nfc)
    pretokenizer.split(tok::nfc(segment), encode_piece);
  else
    pretokenizer.split(segment, encode_piece);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const Impl& impl = *impl_;
  // Positions inside a piece are 32-bit.
  check(text.size() < size_t(INT32_MAX), "text of ", text.size(), " bytes is too long to encode");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);  // English runs at about four bytes per token
  tok::BpeModel::Scratch scratch;
  // Added tokens are found in the raw text, before normalisation, and cut it into segments
  // that are encoded independently: text never merges across an added token.
  size_t segment_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* t = impl.added_token_at(text, pos);
    if (!t) {
      ++pos;
      continue;
    }
    impl.encode_segment(text.substr(segment_start, pos - segment_start), ids, scratch);
    ids.push_back(t->id);
    pos += t->content.size();
    segment_start = pos;
  }
  impl.encode_segment(text.substr(segment_start), ids, scratch);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& impl = *impl_;
  std::string text, run;
  // Regular tokens are collected as raw bytes and turned into text a run at a time, so a
  // character split over two tokens decodes whole; added tokens end a run.
  for (int32_t id : ids) {
    if (const AddedToken* t = impl.find_added(id)) {
      if (skip_special && t->special) continue;
      text += tok::sanitize_utf8(run);
      run.clear();
      text += t->content;
      continue;
    }
    const std::optional<std::string_view> bytes = impl.bpe.bytes_of(id);
    check(bytes.has_value(), "cannot decode token id ", id, ": it is not in the vocabulary");
    run += *bytes;
  }
  text += tok::sanitize_utf8(run);
  return text;
}

std::string Tokenizer::token(int32_t id) const {
  if (const AddedToken* t = impl_->find_added(id)) return t->content;
  const std::optional<std::string_view> bytes = impl_->bpe.bytes_of(id);
  check(bytes.has_value(), "token id ", id, " is not in the vocabulary");
  return tok::bytes_to_symbols(*bytes);
}

int32_t Tokenizer::token_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(std::string(token));
  if (it != impl_->added_by_content.end()) return impl_->added[it->second].id;
  std::optional<std::string> bytes = tok::symbols_to_bytes(token);
  return bytes ? impl_->bpe.id_of(*bytes) : -1;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
bool Tokenizer::pads_left() const { return impl_->pads_left; }
size_t Tokenizer::vocab_size() const { return impl_->bpe.vocab_size(); }
size_t Tokenizer::merge_count() const { return impl_->bpe.merge_count(); }

}  // namespace klein
