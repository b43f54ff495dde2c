#include "tokenizer/tekken.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/base64.h"
#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace klein {

namespace {

using json = nlohmann::json;

// A JSON string literal of `s` (UTF-8), quotes included.
std::string json_string(const std::string& s) { return json(s).dump(); }

int64_t positive_integer(const json& config, const char* key, const std::string& where) {
  auto it = config.find(key);
  check(it != config.end() && it->is_number_integer() && it->get<int64_t>() > 0, where,
        ": config.", key, " must be a positive integer");
  return it->get<int64_t>();
}

}  // namespace

TokenizerBytes tekken_layout_files(const TekkenLayout& t, const std::string& origin) {
  // Written out directly: 131k entries are too many for a DOM to be worth it.
  std::vector<std::string> symbols(t.vocab.size());
  std::string pattern;
  try {  // a token from a GGUF's metadata may be any bytes, which JSON cannot carry
    for (size_t id = 0; id < t.vocab.size(); ++id) symbols[id] = json_string(t.vocab[id]);
    pattern = json_string(t.pattern);
    for (const TekkenLayout::Added& a : t.added) (void)json_string(a.content);
  } catch (const json::exception& e) {
    fail(origin, ": a token is not UTF-8 text (", e.what(), ")");
  }
  std::string out;
  out.reserve(t.vocab.size() * 64);
  out += "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[";
  for (size_t i = 0; i < t.added.size(); ++i) {
    const TekkenLayout::Added& a = t.added[i];
    if (i) out += ',';
    out += "{\"id\":" + std::to_string(a.id) + ",\"content\":" + json_string(a.content) +
           ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
           "\"special\":" + (a.special ? "true" : "false") + "}";
  }
  out += "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
         "{\"type\":\"Split\",\"pattern\":{\"Regex\":" +
         pattern +
         "},\"behavior\":\"Isolated\",\"invert\":false},"
         "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,"
         "\"use_regex\":false}]},"
         "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
         "\"trim_offsets\":true,\"use_regex\":true},"
         "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
         "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
         "\"byte_fallback\":false,\"ignore_merges\":true,\"vocab\":{";
  bool first = true;
  for (size_t id = 0; id < t.vocab.size(); ++id) {
    if (t.vocab[id].empty()) continue;
    if (!first) out += ',';
    first = false;
    out += symbols[id] + ":" + std::to_string(id);
  }
  out += "},\"merges\":[";
  first = true;
  for (auto [l, r] : t.merges) {
    if (!first) out += ',';
    first = false;
    out += "[" + symbols[size_t(l)] + "," + symbols[size_t(r)] + "]";
  }
  out += "]}}";

  TokenizerBytes files;
  files.origin = origin;
  files.tokenizer_json = std::move(out);
  files.tokenizer_config_json =
      R"({"padding_side": "left", "tokenizer_class": "LlamaTokenizerFast"})";
  return files;
}

TokenizerBytes tekken_tokenizer(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, ": not a tekken tokenizer: the JSON does not parse (", e.what(), ")");
  }
  check(j.is_object() && j.contains("config") && j["config"].is_object() && j.contains("vocab") &&
            j["vocab"].is_array(),
        origin, ": not a tekken tokenizer (expected an object with \"config\" and \"vocab\")");
  const json& config = j["config"];
  auto pattern = config.find("pattern");
  check(pattern != config.end() && pattern->is_string() && !pattern->get<std::string>().empty(),
        origin, ": config.pattern must be the pre-tokenization regex");
  const int64_t vocab_size = positive_integer(config, "default_vocab_size", origin);
  const int64_t specials = positive_integer(config, "default_num_special_tokens", origin);
  check(vocab_size > specials, origin, ": config.default_vocab_size ", vocab_size,
        " leaves no room after ", specials, " special tokens");
  // Real vocabularies have about 2^17 tokens; a far larger number is a broken file, not a
  // reason to allocate for it.
  check(vocab_size <= (int64_t(1) << 24), origin, ": config.default_vocab_size ", vocab_size,
        " is beyond any tokenizer (at most 16777216)");
  const json& vocab = j["vocab"];
  const int64_t regular = vocab_size - specials;
  check(int64_t(vocab.size()) >= regular, origin, ": vocab holds ", vocab.size(),
        " tokens; default_vocab_size ", vocab_size, " less ", specials, " special tokens needs ",
        regular);

  // The special tokens' names, by id.
  std::vector<std::string> names(static_cast<size_t>(specials));
  for (int64_t i = 0; i < specials; ++i) names[size_t(i)] = "<SPECIAL_" + std::to_string(i) + ">";
  check(j.contains("special_tokens") && j["special_tokens"].is_array(), origin,
        ": no special_tokens list (tekken files before version v7 name them in code, which this "
        "reader does not know)");
  for (const json& s : j["special_tokens"]) {
    const std::string at = origin + ": special_tokens entry " + s.dump().substr(0, 60);
    check(s.is_object() && s.contains("rank") && s["rank"].is_number_integer() &&
              s.contains("token_str") && s["token_str"].is_string(),
          at, ": expected {\"rank\": integer, \"token_str\": string}");
    const int64_t rank = s["rank"].get<int64_t>();
    check(rank >= 0 && rank < specials, at, ": rank ", rank, " is outside the ", specials,
          " special ids");
    names[size_t(rank)] = s["token_str"].get<std::string>();
  }

  // The regular tokens' bytes in rank order, and the rank of each.
  std::vector<std::string> tokens(static_cast<size_t>(regular));
  for (int64_t r = 0; r < regular; ++r) {
    const json& t = vocab[size_t(r)];
    const std::string at = origin + ": vocab[" + std::to_string(r) + "]";
    check(t.is_object() && t.contains("rank") && t["rank"].is_number_integer() &&
              t["rank"].get<int64_t>() == r,
          at, ": expected rank ", r, " (the list is in rank order)");
    const json* b = t.contains("token_bytes") ? &t["token_bytes"] : nullptr;
    check(b && b->is_string(), at, ": token_bytes must be a base64 string");
    std::optional<std::string> bytes = base64_decode(b->get<std::string>());
    check(bytes && !bytes->empty(), at, ": token_bytes is not base64 of one byte or more");
    tokens[size_t(r)] = std::move(*bytes);
  }
  std::unordered_map<std::string_view, int32_t> rank_of;
  rank_of.reserve(tokens.size());
  for (size_t r = 0; r < tokens.size(); ++r) {
    const auto [at, added] = rank_of.emplace(tokens[r], int32_t(r));
    if (!added) fail(origin, ": vocab[", r, "] repeats the bytes of vocab[", at->second, "]");
  }

  std::unordered_map<std::string, int64_t> special_id;
  for (int64_t i = 0; i < specials; ++i) {
    const auto [at, added] = special_id.emplace(names[size_t(i)], i);
    if (!added) fail(origin, ": special tokens ", at->second, " and ", i, " are both ", names[size_t(i)]);
  }
  TekkenLayout layout;
  layout.pattern = pattern->get<std::string>();
  layout.vocab.reserve(size_t(vocab_size));
  for (int64_t i = 0; i < specials; ++i) {
    layout.vocab.push_back(names[size_t(i)]);
    layout.added.push_back({i, names[size_t(i)], true});
  }
  for (size_t r = 0; r < tokens.size(); ++r) {
    std::string s = tok::bytes_to_symbols(tokens[r]);
    if (auto same = special_id.find(s); same != special_id.end())
      fail(origin, ": vocab[", r, "] is spelled like special token ", same->second, " (", s, ")");
    layout.vocab.push_back(std::move(s));
  }
  // The converter's merges: per token in rank order, its cuts into two tokens.
  std::vector<std::pair<int32_t, int32_t>> cuts;
  for (const std::string& t : tokens) {
    cuts.clear();
    const std::string_view v(t);
    for (size_t k = 1; k < v.size(); ++k) {
      auto left = rank_of.find(v.substr(0, k));
      auto right = rank_of.find(v.substr(k));
      if (left != rank_of.end() && right != rank_of.end()) cuts.emplace_back(left->second, right->second);
    }
    std::sort(cuts.begin(), cuts.end());
    for (auto [l, r] : cuts) layout.merges.emplace_back(specials + l, specials + r);
  }
  return tekken_layout_files(layout, origin);
}

}  // namespace klein
