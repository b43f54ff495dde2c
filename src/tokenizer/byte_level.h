#pragma once
// The GPT-2 byte-level alphabet and small UTF-8 helpers.
//
// Byte-level BPE vocabularies never store raw bytes: every byte is written as one printable
// code point so that vocab.json and merges.txt stay plain text (space 0x20 is "Ġ" U+0120,
// LF 0x0A is "Ċ" U+010A). The map is a bijection, so the tokenizer converts every vocabulary
// entry back to raw bytes once at load time and afterwards works on bytes only.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace klein::tok {

// The printable code point that stands for byte `b` (U+0021..U+00FF or U+0100..U+0143).
char32_t byte_to_symbol(uint8_t b);

// The byte a code point stands for, or -1 if it is not part of the byte-level alphabet.
int symbol_to_byte(char32_t cp);

// "Ġworld" -> " world". Returns nothing if `symbols` is not valid UTF-8 or holds a code
// point outside the alphabet (then it cannot be a byte-level token).
std::optional<std::string> symbols_to_bytes(std::string_view symbols);
// The same into a caller's buffer (replacing its contents), to reuse its memory when
// converting a whole vocabulary. Returns false where the above returns nothing.
bool symbols_to_bytes(std::string_view symbols, std::string& bytes);

// " world" -> "Ġworld": the form vocab.json and merges.txt use.
std::string bytes_to_symbols(std::string_view bytes);

// Appends the UTF-8 encoding of `cp` (assumed a valid scalar value).
void append_utf8(std::string& out, char32_t cp);

// Length of the valid UTF-8 prefix of `s` (== s.size() when all of it is valid).
size_t valid_utf8_prefix(std::string_view s);

// Copies `bytes` replacing every ill-formed UTF-8 subsequence by U+FFFD, one replacement per
// maximal ill-formed subpart (the Unicode "best practice" that Python's errors="replace"
// and Rust's from_utf8_lossy both follow). Tokens can end in the middle of a character, so
// decoding an arbitrary id sequence needs this.
std::string sanitize_utf8(std::string_view bytes);

}  // namespace klein::tok
