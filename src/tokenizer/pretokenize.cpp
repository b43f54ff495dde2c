#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace klein::tok {

namespace {

// The reference implementations' `\s` is the Unicode White_Space property (Oniguruma's
// in the tokenizers library, the Python `regex` module's in the slow tokenizer). PCRE2's `\s`
// with UCP is "separator or tab..CR" instead, which leaves out U+0085 (NEXT LINE), so the
// class is written out here: all 25 White_Space code points, as the inside of a character
// class.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// The general categories \p{...} may name: the same sets in Oniguruma and PCRE2.
constexpr std::string_view kCategories[] = {
    "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl",
    "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk",
    "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Co", "Cs", "Cn"};

bool is_hex(char c) { return std::isxdigit(uint8_t(c)) != 0; }

// One pass over an Oniguruma pattern, writing its PCRE2 spelling.
class PatternTranslator {
 public:
  PatternTranslator(std::string_view pattern, const std::string& where)
      : p_(pattern), where_(where) {}

  std::string run() {
    check(valid_utf8_prefix(p_) == p_.size(), where_, ": the pattern is not valid UTF-8");
    int depth = 0;
    bool atom = false;  // something a quantifier may follow was just written
    while (i_ < p_.size()) {
      const size_t at = i_;
      const char c = p_[i_++];
      switch (c) {
        case '\\':
          escape(at, /*in_class=*/false);
          atom = true;
          break;
        case '[':
          char_class(at);
          atom = true;
          break;
        case '(':
          group(at);
          ++depth;
          atom = false;
          break;
        case ')':
          if (depth == 0) refuse(at, "an unmatched \")\"");
          --depth;
          out_ += ')';
          atom = true;
          break;
        case '|':
          out_ += '|';
          atom = false;
          break;
        case '.':
          out_ += "[^\\n]";  // Oniguruma's "." leaves out \n only, whatever PCRE2's newline is
          atom = true;
          break;
        case '^':
        case '$':
          refuse(at, "the anchor \"" + std::string(1, c) + "\" (a line anchor in Oniguruma)");
        case '*':
        case '+':
        case '?':
        case '{':
          if (!atom) refuse(at, "a quantifier with nothing before it");
          quantifier(at, c);
          atom = false;
          break;
        case ']':
        case '}':
          out_ += '\\';
          out_ += c;
          atom = true;
          break;
        default:
          out_ += c;  // a literal (the bytes of a multi-byte character pass through one by one)
          atom = true;
      }
    }
    if (depth != 0) refuse(p_.size(), "a \"(\" that is never closed");
    return out_;
  }

 private:
  [[noreturn]] void refuse(size_t at, const std::string& what) const {
    fail(where_, ": ", what, " at offset ", at, " of the pattern is not supported");
  }

  // After "\" (i_ points past it).
  void escape(size_t at, bool in_class) {
    if (i_ >= p_.size()) refuse(at, "a \"\\\" at the end");
    const char c = p_[i_++];
    switch (c) {
      case 's':
        out_ += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
        return;
      case 'S':
        if (in_class) refuse(at, "\"\\S\" inside a class");
        out_ += "[^" + std::string(kWhiteSpace) + "]";
        return;
      case 'd': out_ += "\\p{Nd}"; return;
      case 'D': out_ += "\\P{Nd}"; return;
      case 'p':
      case 'P': property(at, c == 'P'); return;
      case 'r':
      case 'n':
      case 't':
      case 'f':
        out_ += '\\';
        out_ += c;
        return;
      case 'v':
        out_ += "\\x{0B}";  // PCRE2's \v is the class of vertical spaces
        return;
      case 'a': out_ += "\\x{07}"; return;
      case 'e': out_ += "\\x{1B}"; return;
      case 'x': code_point(at, 'x'); return;
      case 'u': code_point(at, 'u'); return;
      default: break;
    }
    if (uint8_t(c) < 0x80 && !std::isalnum(uint8_t(c))) {
      out_ += '\\';  // escaped punctuation is the character itself in both engines
      out_ += c;
      return;
    }
    refuse(at, "the escape \"\\" + std::string(1, c) + "\"");
  }

  // \xHH, \x{H...} or \uHHHH (i_ points past the x or u).
  void code_point(size_t at, char kind) {
    std::string hex;
    if (kind == 'x' && i_ < p_.size() && p_[i_] == '{') {
      const size_t close = p_.find('}', i_);
      if (close == std::string_view::npos) refuse(at, "an unclosed \"\\x{\"");
      hex = std::string(p_.substr(i_ + 1, close - i_ - 1));
      i_ = close + 1;
    } else {
      const size_t digits = kind == 'x' ? 2 : 4;
      hex = std::string(p_.substr(i_, digits));
      i_ += hex.size();
      if (hex.size() != digits) refuse(at, "a short \"\\" + std::string(1, kind) + "\" escape");
    }
    if (hex.empty() || hex.size() > 6 || !std::all_of(hex.begin(), hex.end(), is_hex))
      refuse(at, "the code point escape \"" + std::string(p_.substr(at, i_ - at)) + "\"");
    out_ += "\\x{" + hex + "}";
  }

  // \p{Name}, \P{Name}, \p{^Name} (i_ points past the p or P).
  void property(size_t at, bool negated) {
    if (i_ >= p_.size() || p_[i_] != '{') refuse(at, "a \"\\p\" without \"{...}\"");
    const size_t close = p_.find('}', i_);
    if (close == std::string_view::npos) refuse(at, "an unclosed \"\\p{\"");
    std::string_view name = p_.substr(i_ + 1, close - i_ - 1);
    i_ = close + 1;
    if (name.starts_with('^')) {
      negated = !negated;
      name.remove_prefix(1);
    }
    if (std::find(std::begin(kCategories), std::end(kCategories), name) == std::end(kCategories))
      refuse(at, "the property \"" + std::string(name) +
                     "\" (only the general categories L, Lu, Ll, Lt, Lm, Lo, M, N, P, S, Z, C "
                     "and their subcategories)");
    out_ += negated ? "\\P{" : "\\p{";
    out_ += name;
    out_ += '}';
  }

  // [...] (i_ points past the "[").
  void char_class(size_t at) {
    out_ += '[';
    if (i_ < p_.size() && p_[i_] == '^') {
      out_ += '^';
      ++i_;
    }
    if (i_ < p_.size() && p_[i_] == ']') refuse(i_, "a \"]\" first in a class (write \\])");
    while (i_ < p_.size()) {
      const size_t here = i_;
      const char c = p_[i_++];
      if (c == ']') {
        out_ += ']';
        return;
      }
      if (c == '\\') {
        escape(here, /*in_class=*/true);
      } else if (c == '[') {
        refuse(here, "a \"[\" inside a class (nested classes and POSIX brackets; write \\[)");
      } else if (c == '&' && i_ < p_.size() && p_[i_] == '&') {
        refuse(here, "a class intersection \"&&\"");
      } else {
        out_ += c;
      }
    }
    refuse(at, "a \"[\" that is never closed");
  }

  // After "(" (i_ points past it).
  void group(size_t at) {
    if (i_ >= p_.size() || p_[i_] != '?') {
      out_ += '(';
      return;
    }
    for (std::string_view opener : {"?:", "?i:", "?=", "?!", "?<=", "?<!"}) {
      if (p_.substr(i_).starts_with(opener)) {
        out_ += '(';
        out_ += opener;
        i_ += opener.size();
        return;
      }
    }
    const size_t close = std::min(p_.find(')', i_), std::min(p_.size(), i_ + 8));
    refuse(at, "the group \"(" + std::string(p_.substr(i_, close - i_)) +
                   "\" (only (...), (?:, (?i:, (?=, (?!, (?<= and (?<!)");
  }

  // A quantifier starting with `c` (already consumed).
  void quantifier(size_t at, char c) {
    bool interval = false;
    if (c == '{') {
      const size_t close = p_.find('}', i_);
      const std::string_view body =
          close == std::string_view::npos ? std::string_view() : p_.substr(i_, close - i_);
      const size_t comma = body.find(',');
      auto digits = [](std::string_view s) {
        return std::all_of(s.begin(), s.end(), [](char d) { return d >= '0' && d <= '9'; });
      };
      const std::string_view low = body.substr(0, comma);
      const std::string_view high =
          comma == std::string_view::npos ? std::string_view() : body.substr(comma + 1);
      const bool ok = !body.empty() && digits(low) && digits(high) && body != "," &&
                      (comma != std::string_view::npos || !low.empty());
      // Oniguruma reads a "{" that is not an interval as a literal; PCRE2 versions differ.
      if (!ok) refuse(at, "a \"{\" that is not an interval {n}, {n,}, {n,m} or {,m} (write \\{)");
      out_ += '{';
      out_ += low.empty() ? "0" : std::string(low);
      out_ += body.substr(low.size());
      out_ += '}';
      i_ = close + 1;
      interval = true;
    } else {
      out_ += c;
    }
    if (i_ < p_.size() && p_[i_] == '?') {
      out_ += '?';  // lazy
      ++i_;
    } else if (i_ < p_.size() && p_[i_] == '+') {
      // Possessive in both engines after ?, * and +; after an interval Oniguruma reads a
      // second quantifier, PCRE2 a possessive one.
      if (interval) refuse(i_, "a \"+\" after an interval");
      out_ += '+';
      ++i_;
    }
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{'))
      refuse(i_, "a quantifier after a quantifier");
  }

  std::string_view p_;
  const std::string& where_;
  size_t i_ = 0;
  std::string out_;
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0)
    return "error " + std::to_string(code);
  return reinterpret_cast<const char*>(buffer);
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (uint8_t(c) >= 0x80) return false;
  return true;
}

}  // namespace

std::string nfc(std::string_view text) {
  // ASCII is already in NFC; prompts are mostly ASCII, so skip the copy through utf8proc.
  if (is_ascii(text)) return std::string(text);
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          utf8proc_ssize_t(text.size()), &out,
                                          utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    const size_t bad = valid_utf8_prefix(text);
    fail("text is not valid UTF-8 (byte ", bad, " of ", text.size(), "): ", utf8proc_errmsg(n));
  }
  std::string result(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return result;
}

struct Pretokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

std::string translate_split_pattern(std::string_view pattern, const std::string& where) {
  return PatternTranslator(pattern, where).run();
}

Pretokenizer::Pretokenizer() : Pretokenizer(kQwen2Pattern, "the Qwen2 pre-tokenizer pattern") {}

Pretokenizer::Pretokenizer(std::string_view oniguruma_pattern, const std::string& where)
    : regex_(std::make_unique<Regex>()) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string pattern = translate_split_pattern(oniguruma_pattern, where);
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (!regex_->code)
    fail(where, ": the pattern does not compile (as the PCRE2 pattern ", pattern, ", at offset ",
         error_offset, "): ", pcre2_message(error));
  // JIT is only a speed-up: when the platform has none, the interpreter gives the same matches.
  pcre2_jit_compile(regex_->code, PCRE2_JIT_COMPLETE);
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;

void* Pretokenizer::new_match_data() const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  if (!md) throw std::bad_alloc();
  return md;
}

void Pretokenizer::free_match_data(void* match_data) {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data));
}

bool Pretokenizer::next_match(std::string_view text, size_t offset, size_t* begin, size_t* end,
                              void* match_data) const {
  auto* md = static_cast<pcre2_match_data*>(match_data);
  // PCRE2 validates the whole subject on every call unless told not to; once the first call
  // has checked it, later calls (which start at the end of a match, a character boundary)
  // skip the check, otherwise splitting would be quadratic in the text length.
  const uint32_t options = offset == 0 ? 0 : PCRE2_NO_UTF_CHECK;
  const int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(),
                             offset, options, md, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
      fail("text is not valid UTF-8 (byte ", pcre2_get_startchar(md), "): ", pcre2_message(rc));
    fail("pre-tokenizer regex failed: ", pcre2_message(rc));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
  *begin = ovector[0];
  *end = ovector[1];
  return true;
}

std::vector<std::string> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces;
  split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace klein::tok
