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

// The Qwen2 pre-tokenisation pattern (spec section 3, step 3) as tokenizer.json spells it,
// in the syntax of the Oniguruma engine the tokenizers library compiles it with.
inline constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Rewrites a Split pattern of tokenizer.json (Oniguruma syntax, Ruby flavour) as a PCRE2
// pattern (compiled with UTF and UCP) that matches the same text. Supported:
//   literals, escaped punctuation, \r \n \t \f \v \a \e, \xHH, \x{H...}, \uHHHH;
//   \s \S (Unicode White_Space, spelled out: PCRE2's own \s differs), \d \D (\p{Nd});
//   \p{X} \P{X} \p{^X} for the general categories (L, Lu, Ll, Lt, Lm, Lo, M, Mn, Mc, Me,
//   N, Nd, Nl, No, P.., S.., Z, Zs, Zl, Zp, C, Cc, Cf, Co, Cs, Cn);
//   classes [...] and [^...] of those, with ranges; "." (any character but \n);
//   groups (...), (?:...), (?i:...), (?=...), (?!...), (?<=...), (?<!...);
//   | and the quantifiers ? * + {n} {n,} {n,m} {,m}, lazy (?) or, except after {...},
//   possessive (+).
// Anything else (\w, \b, anchors, back-references, named or atomic groups, nested classes
// or class intersections, POSIX brackets, scripts as properties, inline options other than
// (?i:) is refused: throws klein::Error "<where>: ..." naming the construct and its offset.
// (Not reproduced: Oniguruma's multi-character case folds, as "ss" against "ß" under (?i:).)
std::string translate_split_pattern(std::string_view pattern, const std::string& where);

// Splits a segment into pieces with a Split pre-tokenizer of behaviour "Isolated": every
// match of the pattern is a piece, and so is every stretch of text between two matches.
// Compiled once; safe to use from several threads at the same time.
class Pretokenizer {
 public:
  // Qwen2's pattern.
  Pretokenizer();
  // A tokenizer.json Split pattern (see translate_split_pattern); `where` names it in errors.
  Pretokenizer(std::string_view oniguruma_pattern, const std::string& where);
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Calls on_piece(std::string_view) for every piece of `text` (valid UTF-8), in order.
  template <class OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const;

  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Regex;
  // Finds the match starting at or after `offset`: returns false when there is none.
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
  // The matches are found as the tokenizers library finds them (Oniguruma's find_iter): from
  // the end of the last match on, except that an empty match right where the last match
  // ended is skipped by searching again one character later. Empty pieces are dropped.
  size_t search = 0, piece_start = 0, begin = 0, end = 0;
  size_t last_match_end = std::string_view::npos;
  while (search <= text.size() && next_match(text, search, &begin, &end, md.get())) {
    if (begin == end && end == last_match_end) {
      if (search == text.size()) break;
      ++search;  // to the next character: past the lead byte and any continuation bytes
      while (search < text.size() && (uint8_t(text[search]) & 0xC0) == 0x80) ++search;
      continue;
    }
    if (piece_start < begin) on_piece(text.substr(piece_start, begin - piece_start));
    if (begin < end) on_piece(text.substr(begin, end - begin));
    piece_start = search = last_match_end = end;
  }
  if (piece_start < text.size()) on_piece(text.substr(piece_start));
}

}  // namespace klein::tok
