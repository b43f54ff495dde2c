// libFuzzer target: the tokenizer files (vocab.json, merges.txt, tokenizer_config.json, or
// tokenizer.json), split from one input at \x01 bytes, and encoding a fixed text with the
// result; the input as Mistral's tekken.json; also the input itself as text to encode with a
// small valid vocabulary.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz/fuzz_support.h"
#include "tokenizer/tekken.h"
#include "tokenizer/tokenizer.h"

namespace {

// A byte-level vocabulary of the 256 single-byte tokens, two merges and one added token.
const klein::Tokenizer& small_tokenizer() {
  static const klein::Tokenizer tok = [] {
    static std::string vocab = "{";
    // The byte-to-unicode table of byte-level BPE, as GPT-2 defines it.
    auto unit = [](int b) -> std::u32string {
      if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return std::u32string(1, char32_t(b));
      int n = 0;
      for (int c = 0; c < b; ++c)
        if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) ++n;
      return std::u32string(1, char32_t(256 + n));
    };
    auto utf8 = [](char32_t c) {
      std::string s;
      if (c < 0x80) {
        s += char(c);
      } else {
        s += char(0xC0 | (c >> 6));
        s += char(0x80 | (c & 0x3F));
      }
      return s;
    };
    for (int b = 0; b < 256; ++b) {
      std::string key = utf8(unit(b)[0]);
      if (key == "\"" || key == "\\") key = "\\" + key;
      vocab += (b ? "," : "") + std::string("\"") + key + "\":" + std::to_string(b);
    }
    vocab += ",\"ab\":256,\"abc\":257}";
    static const std::string merges = "#version: 0.2\na b\nab c\n";
    static const std::string config =
        R"({"added_tokens_decoder": {"258": {"content": "<|im_start|>", "special": true}}})";
    klein::TokenizerFiles files;
    files.origin = "fuzz";
    files.vocab_json = vocab;
    files.merges_txt = merges;
    files.tokenizer_config_json = config;
    return klein::Tokenizer(files);
  }();
  return tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = klein::fuzz::split<4>(data, size);
  klein::TokenizerFiles files;
  files.origin = "fuzz";
  if (!parts[3].empty()) {
    files.tokenizer_json = parts[3];
  } else {
    files.vocab_json = parts[0];
    files.merges_txt = parts[1];
  }
  if (!parts[2].empty()) files.tokenizer_config_json = parts[2];
  try {
    const klein::Tokenizer tok(files);
    (void)tok.decode(tok.encode("a cat <|im_start|> on a skateboard, caf\xc3\xa9"));
  } catch (const klein::Error&) {
  }
  try {
    // The whole input as Mistral's tekken.json.
    const klein::TokenizerBytes b = klein::tekken_tokenizer(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz tekken.json");
    const klein::Tokenizer tok(b.files());
    (void)tok.decode(tok.encode("[INST]a cat on a skateboard, 2024 caf\xc3\xa9[/INST]"));
  } catch (const klein::Error&) {
  }
  try {
    const auto ids = small_tokenizer().encode(
        std::string_view(reinterpret_cast<const char*>(data), size));
    (void)small_tokenizer().decode(ids);
  } catch (const klein::Error&) {
  }
  return 0;
}
