#pragma once
// The byte-level BPE tokenizer of the text encoders: Qwen2/Qwen3's (spec/qwen3-tokenizer.md,
// FLUX.2-klein and Z-Image) and Mistral's Tekken as transformers converts it to a
// tokenizer.json (Mistral-Small-3.1, FLUX.2-dev).
//
//   auto tok = klein::Tokenizer::from_directory(model_dir / "tokenizer");
//   std::vector<int32_t> ids = tok.encode("a cat on a skateboard");
//   std::string text = tok.decode(ids);
//
// Encoding: added tokens (<|im_start|>, [INST], ...) are split out of the raw text first,
// longest match left to right; every text segment between them is normalised (or not),
// split into pieces by the pre-tokenisation regex, and each piece is BPE-merged on its UTF-8
// bytes. Nothing is added around the text (no BOS/EOS, whatever tokenizer.json's
// post_processor says: the chat templates write them). A Tokenizer is immutable after
// construction and safe to share between threads.
//
// What tokenizer.json may say (anything else is refused, naming the file and the field):
//   normalizer      absent (Qwen2's NFC), null (none), or NFC;
//   pre_tokenizer   absent (Qwen2's pattern, built in), or Sequence[Split(Regex(PATTERN),
//                   "Isolated", invert false), ByteLevel(add_prefix_space false,
//                   use_regex false)]: matches and the text between them are the pieces.
//                   PATTERN is Oniguruma's syntax, translated to PCRE2
//                   (tok::translate_split_pattern lists the constructs it takes);
//   model           "BPE" with the byte-level alphabet, merges as "A B" or ["A", "B"],
//                   ignore_merges (a piece that is a vocabulary token as a whole is that
//                   token), and none of byte_fallback, dropout or subword affixes;
//   decoder         absent, null or ByteLevel; post_processor is not read.
// vocab.json + merges.txt (the "slow" layout) get Qwen2's normaliser and pattern. (Qwen's
// reference "slow" tokenizer normalises the whole text before finding added tokens, the
// "fast" one after, as here; they differ only when the character after an added token
// composes with its last one under NFC, as ">" + U+0338 does.)
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace klein {

// The contents of the tokenizer files, however they were obtained (a model directory, or
// the bytes a container stores). Absent files are nullopt. The views only need to stay valid
// while the Tokenizer constructor runs.
//
// Either tokenizer.json (which holds everything), or vocab.json + merges.txt, must be
// present; when tokenizer.json is there, vocab.json and merges.txt are not read. Added
// tokens come from tokenizer.json's "added_tokens" and from tokenizer_config.json's
// "added_tokens_decoder"; when both name an id they must agree, and an added token may not
// take an id the vocabulary gives to another token. (Nothing else is read from
// tokenizer_config.json: the pad token of the Klein prompt is <|endoftext|> by name.)
struct TokenizerFiles {
  std::string origin;  // where the files live, for error messages, e.g. "model/tokenizer"
  std::optional<std::string_view> vocab_json;
  std::optional<std::string_view> merges_txt;
  std::optional<std::string_view> tokenizer_config_json;
  std::optional<std::string_view> tokenizer_json;
};

// The same files held as owned strings (read from a directory, a container or a GGUF's
// metadata), and the view of them a Tokenizer is built from.
struct TokenizerBytes {
  std::string origin;  // where they came from, for error messages
  std::optional<std::string> vocab_json;
  std::optional<std::string> merges_txt;
  std::optional<std::string> tokenizer_config_json;
  std::optional<std::string> tokenizer_json;

  TokenizerFiles files() const {
    auto view = [](const std::optional<std::string>& s) -> std::optional<std::string_view> {
      if (!s) return std::nullopt;
      return std::string_view(*s);
    };
    return {origin, view(vocab_json), view(merges_txt), view(tokenizer_config_json),
            view(tokenizer_json)};
  }
};

// A token matched as a whole in the raw text before any other processing.
struct AddedToken {
  int32_t id = -1;
  std::string content;   // the literal text, e.g. "<|im_start|>"
  bool special = false;  // only affects decode(..., skip_special = true)
};

class Tokenizer {
 public:
  // Reads vocab.json, merges.txt, tokenizer_config.json and tokenizer.json from `dir` (the
  // ones that exist) and builds the tokenizer. Throws klein::Error naming the file and the
  // problem when something is missing or malformed.
  static Tokenizer from_directory(const std::filesystem::path& dir);
  explicit Tokenizer(const TokenizerFiles& files);

  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of UTF-8 text. Throws klein::Error if the text is not valid UTF-8.
  std::vector<int32_t> encode(std::string_view text) const;

  // Text of a sequence of ids. Byte sequences that do not form valid UTF-8 (a token run cut
  // in the middle of a character) come out as U+FFFD. Throws klein::Error on an id that is
  // neither in the vocabulary nor an added token.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  // A token as the files spell it: byte-level symbols for vocabulary tokens ("Ġworld" for
  // " world"), the literal content for added tokens. Throws on an unknown id.
  std::string token(int32_t id) const;
  // The id of a token spelled as token() returns it, or -1.
  int32_t token_id(std::string_view token) const;

  const std::vector<AddedToken>& added_tokens() const;
  // tokenizer_config.json's "padding_side" is "left" (transformers pads on the right when the
  // file does not say).
  bool pads_left() const;
  size_t vocab_size() const;  // regular (BPE) tokens, without the added ones
  size_t merge_count() const;

 private:
  struct Impl;
  std::unique_ptr<const Impl> impl_;
};

}  // namespace klein
