#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace klein::tok {

namespace {

// The reference implementation's `\s` is the Unicode White_Space property (it uses the
// Python `regex` module). PCRE2's `\s` with UCP is "separator or tab..CR" instead, which
// leaves out U+0085 (NEXT LINE), so the class is written out here: all 25 White_Space code
// points, as the inside of a character class.
constexpr std::string_view kWhiteSpace =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";

// The Qwen2 pre-tokenisation pattern (spec section 3, step 3) with \s and \S spelled out.
// Alternatives are tried in order; see the spec for what each one is for.
std::string pretokenize_pattern() {
  const std::string ws(kWhiteSpace);
  return "(?i:'s|'t|'re|'ve|'m|'ll|'d)"                 // contraction suffixes
         "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"               // letters, maybe one symbol before
         "|\\p{N}"                                      // one number character
         "| ?[^" + ws + "\\p{L}\\p{N}]+[\\r\\n]*"       // symbols, maybe one space before
         "|[" + ws + "]*[\\r\\n]+"                      // line breaks, spaces before them
         "|[" + ws + "]+(?![^" + ws + "])"              // spaces not followed by a non-space
         "|[" + ws + "]+";                              // any other spaces
}

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

Pretokenizer::Pretokenizer() : regex_(std::make_unique<Regex>()) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  const std::string pattern = pretokenize_pattern();
  regex_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                               PCRE2_UTF | PCRE2_UCP, &error, &error_offset, nullptr);
  if (!regex_->code)
    fail("pre-tokenizer regex does not compile at offset ", error_offset, ": ",
         pcre2_message(error));
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
  // Every alternative consumes at least one character; an empty match would loop forever.
  check(*end > *begin, "pre-tokenizer regex matched nothing at byte ", *begin);
  return true;
}

std::vector<std::string> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces;
  split(text, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

}  // namespace klein::tok
