#pragma once
// Text normalisation and pre-tokenisation: the two steps between "a segment of plain text"
// and "pieces that BPE runs on one at a time".
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace klein::tok {

// Unicode NFC of UTF-8 text (utf8proc). Throws klein::Error on invalid UTF-8.
std::string nfc(std::string_view text);

// Splits a segment into pieces with the Qwen2 pre-tokenisation regex (spec section 3,
// step 3). Compiled once; safe to use from several threads at the same time.
class Pretokenizer {
 public:
  Pretokenizer();
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Calls on_piece(std::string_view) for every piece of `text` (valid UTF-8), in order.
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const;

  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Regex;
  // Finds the match starting at or after `offset`: returns false at the end of the text.
  bool next_match(std::string_view text, size_t offset, size_t* begin, size_t* end,
                  void* match_data) const;
  void* new_match_data() const;
  static void free_match_data(void* match_data);

  std::unique_ptr<Regex> regex_;
};

template <class OnPiece>
void Pretokenizer::split(std::string_view text, OnPiece&& on_piece) const {
  if (text.empty()) return;
  std::unique_ptr<void, void (*)(void*)> md(new_match_data(), &free_match_data);
  size_t offset = 0, begin = 0, end = 0;
  while (offset < text.size() && next_match(text, offset, &begin, &end, md.get())) {
    on_piece(text.substr(begin, end - begin));
    offset = end;
  }
}

}  // namespace klein::tok
