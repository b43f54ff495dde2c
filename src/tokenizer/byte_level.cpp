#include "tokenizer/byte_level.h"

#include <array>

namespace klein::tok {

namespace {

// Bytes that are printable Latin-1 characters keep their own code point; the other 68
// (controls, space, DEL, NBSP, soft hyphen) get U+0100 onwards in increasing byte order.
constexpr bool keeps_own_code_point(int b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

constexpr char32_t kFirstRemapped = 0x100;
constexpr char32_t kAlphabetEnd = 0x144;  // one past the last remapped code point

struct Tables {
  std::array<char32_t, 256> symbol_of_byte{};
  std::array<int16_t, kAlphabetEnd> byte_of_symbol{};

  constexpr Tables() {
    for (auto& b : byte_of_symbol) b = -1;
    char32_t next = kFirstRemapped;
    for (int b = 0; b < 256; ++b) {
      char32_t cp = keeps_own_code_point(b) ? char32_t(b) : next++;
      symbol_of_byte[size_t(b)] = cp;
      byte_of_symbol[cp] = int16_t(b);
    }
  }
};

constexpr Tables kTables;
static_assert(kTables.symbol_of_byte[0x20] == 0x120, "space must map to U+0120");
static_assert(kTables.symbol_of_byte[0x0A] == 0x10A, "LF must map to U+010A");
static_assert(kTables.symbol_of_byte[0xAD] == 0x143, "soft hyphen is the last remapped byte");

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// Decodes the sequence starting at s[i]. Returns its length (> 0) and the code point when it
// is well formed; otherwise returns minus the length of the maximal ill-formed subpart, i.e.
// the lead byte plus the continuation bytes that were still acceptable (Unicode table 3-7).
int next_code_point(std::string_view s, size_t i, char32_t* cp) {
  const uint8_t lead = uint8_t(s[i]);
  if (lead < 0x80) {
    *cp = lead;
    return 1;
  }
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;  // no overlong forms
    if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;  // no overlong forms
    if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // a stray continuation byte, C0/C1 or F5..FF
  }
  char32_t value = lead & (0x3F >> need);
  for (int k = 1; k <= need; ++k) {
    if (i + size_t(k) >= s.size()) return -k;
    const uint8_t b = uint8_t(s[i + size_t(k)]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : is_continuation(b);
    if (!ok) return -k;
    value = (value << 6) | (b & 0x3F);
  }
  *cp = value;
  return need + 1;
}

}  // namespace

char32_t byte_to_symbol(uint8_t b) { return kTables.symbol_of_byte[b]; }

int symbol_to_byte(char32_t cp) { return cp < kAlphabetEnd ? kTables.byte_of_symbol[cp] : -1; }

bool symbols_to_bytes(std::string_view symbols, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < symbols.size();) {
    char32_t cp;
    const int n = next_code_point(symbols, i, &cp);
    if (n < 0) return false;
    const int b = symbol_to_byte(cp);
    if (b < 0) return false;
    bytes.push_back(char(b));
    i += size_t(n);
  }
  return true;
}

std::optional<std::string> symbols_to_bytes(std::string_view symbols) {
  std::string bytes;
  if (!symbols_to_bytes(symbols, bytes)) return std::nullopt;
  return bytes;
}

std::string bytes_to_symbols(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_symbol(uint8_t(c)));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t valid_utf8_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {  // fast path for ASCII runs
      ++i;
      continue;
    }
    char32_t cp;
    const int n = next_code_point(s, i, &cp);
    if (n < 0) break;
    i += size_t(n);
  }
  return i;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    char32_t cp;
    const int n = next_code_point(bytes, i, &cp);
    if (n > 0) {
      out.append(bytes.substr(i, size_t(n)));
      i += size_t(n);
    } else {
      append_utf8(out, 0xFFFD);
      i += size_t(-n);
    }
  }
  return out;
}

}  // namespace klein::tok
