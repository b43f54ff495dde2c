// Loading a Tokenizer from its files: vocab.json + merges.txt + tokenizer_config.json (the
// "slow" layout) or tokenizer.json (the "fast" layout, one file with everything).
//
// vocab.json and tokenizer.json are large (151k entries, 3 to 11 MB), and building a DOM for
// them costs five times more than reading them as a stream of events, so they go through
// nlohmann's SAX interface straight into the BPE tables. tokenizer_config.json is small and
// is read as a normal DOM.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>

#include "core/error.h"
#include "core/files.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer_impl.h"

namespace klein {

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Ids beyond this are certainly a corrupt file; refusing them keeps a bad number from
// turning into a huge allocation.
constexpr uint64_t kMaxTokenId = uint64_t(1) << 24;

// A token that shows a text fragment in error messages without flooding them.
std::string shown(std::string_view s) {
  constexpr size_t kMax = 40;
  std::string out = "\"";
  out.append(s.substr(0, kMax));
  if (s.size() > kMax) out += "...";
  return out + "\"";
}

struct RawAddedToken {
  int64_t id = -1;
  std::string content;
  bool has_content = false;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false;
  std::string where;  // "tokenizer.json: added_tokens[3]", for error messages
};

// Everything read from the files, before it is checked and turned into a Tokenizer::Impl.
struct Collected {
  std::string vocab_file;  // the file the vocabulary came from
  std::string merges_file;
  tok::MergeList merges;
  std::vector<uint32_t> merge_lines;  // merges.txt: the line of each merge, for messages
  std::vector<RawAddedToken> added;
  bool ignore_merges = false;
  bool pads_left = false;  // tokenizer_config.json: "padding_side": "left"
  // tokenizer.json's pipeline around the model, as written (absent: nullopt).
  std::optional<json> normalizer, pre_tokenizer, decoder;
};

// Builds a JSON value from SAX events: the small parts of tokenizer.json that describe the
// pipeline are kept whole and read after parsing.
class JsonBuilder {
 public:
  void value(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
    } else if (stack_.back()->is_array()) {
      stack_.back()->push_back(std::move(v));
    } else {
      (*stack_.back())[key_] = std::move(v);
    }
  }
  void open(json container) {
    value(std::move(container));
    json* top = stack_.empty()              ? &root_
                : stack_.back()->is_array() ? &stack_.back()->back()
                                            : &(*stack_.back())[key_];
    stack_.push_back(top);
  }
  void key(std::string k) { key_ = std::move(k); }
  // Returns true when the outermost container closed.
  bool close() {
    stack_.pop_back();
    return stack_.empty();
  }
  json take() { return std::move(root_); }

 private:
  json root_;
  std::vector<json*> stack_;
  std::string key_;
};

// ---------------------------------------------------------------------------------------
// Streaming reader for vocab.json and tokenizer.json

class TokenizerJsonReader final : public json::json_sax_t {
 public:
  enum class Layout {
    kVocabJson,      // {"token": id, ...} at the top level
    kTokenizerJson,  // model.vocab, model.merges, added_tokens
  };

  TokenizerJsonReader(Layout layout, std::string file, tok::BpeModel& bpe, Collected& out)
      : layout_(layout), file_(std::move(file)), bpe_(bpe), out_(out) {}

  size_t vocab_entries() const { return vocab_entries_; }

  bool null() override {
    if (captured(nullptr)) return true;
    return scalar_other("null");
  }
  bool boolean(bool v) override {
    if (captured(v)) return true;
    if (at_model_key("ignore_merges")) {
      out_.ignore_merges = v;
      return element_done();
    }
    if (at_model_key("byte_fallback")) {
      if (v) fail(where(), ": true is not supported (only false, as Qwen's tokenizers have)");
      return element_done();
    }
    if (RawAddedToken* t = added_field("special"))
      t->special = v;
    else if ((t = added_field("lstrip")))
      t->lstrip = v;
    else if ((t = added_field("rstrip")))
      t->rstrip = v;
    else if ((t = added_field("single_word")))
      t->single_word = v;
    else
      return scalar_other("a boolean");
    return element_done();
  }
  bool number_integer(number_integer_t v) override {
    if (captured(v)) return true;
    if (v >= 0) return number_unsigned(number_unsigned_t(v));
    if (at_vocab_entry() || added_field("id")) fail(where(), ": negative token id ", v);
    return scalar_other("a number");
  }
  bool number_unsigned(number_unsigned_t v) override {
    if (captured(v)) return true;
    if (at_vocab_entry()) {
      add_vocab_entry(v);
    } else if (RawAddedToken* t = added_field("id")) {
      if (v >= kMaxTokenId) fail(where(), ": token id ", v, " is out of range");
      t->id = int64_t(v);
    } else {
      return scalar_other("a number");
    }
    return element_done();
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (captured(v)) return true;
    return scalar_other("a fraction");
  }
  bool string(string_t& v) override {
    if (captured(v)) return true;
    if (at_merge_string()) {
      add_merge_string(v);
    } else if (at_merge_pair_part()) {
      auto& pair = pending_pair_;
      if (pair_parts_ >= 2) fail(where(), ": a merge pair has more than two parts");
      (pair_parts_ == 0 ? pair.first : pair.second) = std::move(v);
      ++pair_parts_;
    } else if (RawAddedToken* t = added_field("content")) {
      t->content = std::move(v);
      t->has_content = true;
    } else if (at_model_key("type")) {
      // Checked at once: "type" comes first in the files tokenizers writes, and another
      // model's vocabulary would otherwise fail later with a less helpful message. (Without a
      // type the model is taken as BPE, as the tokenizers library infers it from its fields.)
      if (v != "BPE") fail(where(), ": ", shown(v), " is not supported, expected \"BPE\"");
    } else if (at_model_key("continuing_subword_prefix") || at_model_key("end_of_word_suffix")) {
      // Affixes change which vocabulary entries a merge produces.
      if (!v.empty())
        fail(where(), ": ", shown(v), " is not supported (only \"\" or null, as Qwen's have)");
    } else {
      return scalar_other("a string");
    }
    return element_done();
  }
  bool binary(binary_t&) override { return scalar_other("binary data"); }

  bool start_object(std::size_t) override {
    if (capture_open(json::object())) return true;
    if (at_vocab_entry() || at_merge_string() || at_merge_pair_part() || at_model_key("type"))
      fail(where(), ": unexpected object");
    if (at_added_token()) {
      pending_added_ = RawAddedToken{};
      pending_added_.where = where();
    }
    path_.push_back({false, {}, 0});
    return true;
  }
  bool key(string_t& k) override {
    if (capture_depth_ > 0)
      builder_.key(std::move(k));
    else
      path_.back().key = std::move(k);
    return true;
  }
  bool end_object() override {
    if (capture_close()) return true;
    path_.pop_back();
    if (at_added_token()) out_.added.push_back(std::move(pending_added_));
    return element_done();
  }
  bool start_array(std::size_t) override {
    if (capture_open(json::array())) return true;
    if (at_vocab_entry()) fail(where(), ": expected a token id, found an array");
    if (at_merge_pair_part() || at_model_key("type") || at_added_token())
      fail(where(), ": unexpected array");
    if (at_merge_string()) {
      pending_pair_ = {};
      pair_parts_ = 0;
    }
    if (path_.empty()) check(layout_ != Layout::kVocabJson, file_, ": expected a JSON object");
    path_.push_back({true, {}, 0});
    return true;
  }
  bool end_array() override {
    if (capture_close()) return true;
    path_.pop_back();
    if (at_merge_string()) {
      if (pair_parts_ != 2) fail(where(), ": a merge pair needs exactly two parts");
      add_merge(pending_pair_.first, pending_pair_.second);
    }
    return element_done();
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail(file_, ": not valid JSON: ", e.what());
  }

 private:
  struct Frame {
    bool array;
    std::string key;  // current key, for objects
    size_t index;     // current element, for arrays
  };

  // The parts kept whole: "normalizer", "pre_tokenizer" and "decoder" at the top level.
  std::optional<json>* capture_slot() {
    if (layout_ != Layout::kTokenizerJson || path_.size() != 1 || path_[0].array) return nullptr;
    const std::string& k = path_[0].key;
    return k == "normalizer"      ? &out_.normalizer
           : k == "pre_tokenizer" ? &out_.pre_tokenizer
           : k == "decoder"       ? &out_.decoder
                                  : nullptr;
  }
  // A scalar inside a kept part, or one standing for a whole part ("normalizer": null).
  bool captured(json v) {
    if (capture_depth_ > 0) {
      builder_.value(std::move(v));
      return true;
    }
    if (std::optional<json>* slot = capture_slot()) {
      *slot = std::move(v);
      return true;
    }
    return false;
  }
  bool capture_open(json container) {
    if (capture_depth_ == 0 && !capture_slot()) return false;
    builder_.open(std::move(container));
    ++capture_depth_;
    return true;
  }
  bool capture_close() {
    if (capture_depth_ == 0) return false;
    --capture_depth_;
    if (builder_.close()) *capture_slot() = builder_.take();
    return true;
  }

  // Path tests. The frame stack describes the containers we are inside; a value's own
  // position is the top frame's current key or index.
  bool object_key_is(size_t depth, std::string_view k) const {
    return depth < path_.size() && !path_[depth].array && path_[depth].key == k;
  }
  bool at_model_key(std::string_view k) const {
    return layout_ == Layout::kTokenizerJson && path_.size() == 2 && object_key_is(0, "model") &&
           object_key_is(1, k);
  }
  bool at_vocab_entry() const {
    if (layout_ == Layout::kVocabJson) return path_.size() == 1 && !path_[0].array;
    return path_.size() == 3 && object_key_is(0, "model") && object_key_is(1, "vocab") &&
           !path_[2].array;
  }
  bool at_merge_string() const {
    return layout_ == Layout::kTokenizerJson && path_.size() == 3 && object_key_is(0, "model") &&
           object_key_is(1, "merges") && path_[2].array;
  }
  bool at_merge_pair_part() const {
    return layout_ == Layout::kTokenizerJson && path_.size() == 4 && object_key_is(0, "model") &&
           object_key_is(1, "merges") && path_[2].array && path_[3].array;
  }
  bool at_added_token() const {
    return layout_ == Layout::kTokenizerJson && path_.size() == 2 &&
           object_key_is(0, "added_tokens") && path_[1].array;
  }
  RawAddedToken* added_field(std::string_view name) {
    const bool inside = layout_ == Layout::kTokenizerJson && path_.size() == 3 &&
                        object_key_is(0, "added_tokens") && path_[1].array &&
                        object_key_is(2, name);
    return inside ? &pending_added_ : nullptr;
  }

  // A value nobody asked for: fine, unless it sits where a token id, a merge, an added token
  // or a model setting belongs.
  bool scalar_other(const char* what) {
    if (at_vocab_entry()) fail(where(), ": expected a token id, found ", what);
    if (at_merge_string())
      fail(where(), ": expected a merge (\"A B\" or [\"A\", \"B\"]), found ", what);
    if (at_merge_pair_part()) fail(where(), ": expected a merge symbol (a string), found ", what);
    if (at_added_token()) fail(where(), ": expected an added token (an object), found ", what);
    if (at_model_key("type")) fail(where(), ": expected \"BPE\", found ", what);
    if (at_model_key("dropout") && std::string_view(what) != "null")
      fail(where(), ": BPE dropout is not supported (only null, as Qwen's tokenizers have)");
    if (RawAddedToken* t = added_field("content"))
      fail(t->where, ": \"content\" must be a string, found ", what);
    if (added_field("id")) fail(where(), ": expected a token id, found ", what);
    check(!(path_.empty() && layout_ == Layout::kVocabJson), file_, ": expected a JSON object");
    return element_done();
  }

  // Arrays count their elements so that messages can say which one is wrong.
  bool element_done() {
    if (!path_.empty() && path_.back().array) ++path_.back().index;
    return true;
  }

  std::string where() const {
    std::string w = file_ + ": ";
    if (layout_ == Layout::kVocabJson && path_.size() == 1)
      return w + "token " + shown(path_[0].key);
    for (size_t i = 0; i < path_.size(); ++i) {
      if (path_[i].array) {
        w.append("[").append(std::to_string(path_[i].index)).append("]");
      } else {
        if (i > 0) w += ".";
        w += path_[i].key;
      }
    }
    return w;
  }

  void add_vocab_entry(uint64_t id) {
    const std::string& symbols = path_.back().key;
    if (id >= kMaxTokenId) fail(where(), ": token id ", id, " is out of range");
    if (!tok::symbols_to_bytes(symbols, bytes_))
      fail(where(),
           ": not a byte-level token (it has a character outside the GPT-2 byte alphabet)");
    if (!bpe_.add_token(int32_t(id), bytes_))
      fail(where(), ": id ", id, " is used by another token as well");
    ++vocab_entries_;
  }

  void add_merge_string(std::string_view merge) {
    // Byte-level symbols never contain a real space (the space byte is "Ġ"), so the one
    // space separates the two halves unambiguously.
    const size_t space = merge.find(' ');
    const bool two_halves = space != std::string_view::npos && space > 0 &&
                            space + 1 < merge.size() &&
                            merge.find(' ', space + 1) == std::string_view::npos;
    if (!two_halves)
      fail(where(), ": expected two symbols separated by one space, found ", shown(merge));
    add_merge(merge.substr(0, space), merge.substr(space + 1));
  }

  void add_merge(std::string_view left, std::string_view right) {
    if (!tok::symbols_to_bytes(left, bytes_) || !tok::symbols_to_bytes(right, right_bytes_))
      fail(where(), ": merge ", shown(std::string(left) + " " + std::string(right)),
           " has a character outside the GPT-2 byte alphabet");
    out_.merges.add(bytes_, right_bytes_);
  }

  Layout layout_;
  std::string file_;
  tok::BpeModel& bpe_;
  Collected& out_;
  std::vector<Frame> path_;
  size_t vocab_entries_ = 0;
  std::string bytes_, right_bytes_;  // conversion buffers, reused for every entry
  RawAddedToken pending_added_;
  std::pair<std::string, std::string> pending_pair_;
  int pair_parts_ = 0;
  JsonBuilder builder_;
  int capture_depth_ = 0;
};

// ---------------------------------------------------------------------------------------
// merges.txt

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

// merges.txt: an optional "#version: ..." first line, then one merge "A B" per line, rank =
// position among the non-empty lines (what the reference reader does: strip, skip blanks).
void read_merges_txt(std::string_view text, const std::string& file, Collected& c) {
  const size_t lines = size_t(std::count(text.begin(), text.end(), '\n')) + 1;
  c.merges.reserve(lines, text.size());
  c.merge_lines.reserve(lines);
  std::string a, b;
  uint32_t line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    while (!line.empty() && is_blank(line.front())) line.remove_prefix(1);
    while (!line.empty() && is_blank(line.back())) line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;

    size_t split = 0;
    while (split < line.size() && !is_blank(line[split])) ++split;
    std::string_view left = line.substr(0, split), right = line.substr(split);
    while (!right.empty() && is_blank(right.front())) right.remove_prefix(1);
    const bool two_fields = !right.empty() && std::none_of(right.begin(), right.end(),
                                                           [](char ch) { return is_blank(ch); });
    // (Messages are built only on failure: this loop runs 151k times.)
    if (!two_fields)
      fail(file, ": line ", line_no, ": expected two symbols separated by a space, found ",
           shown(line));
    if (!tok::symbols_to_bytes(left, a) || !tok::symbols_to_bytes(right, b))
      fail(file, ": line ", line_no, ": ", shown(line),
           " has a character outside the GPT-2 byte alphabet");
    c.merges.add(a, b);
    c.merge_lines.push_back(line_no);
  }
}

// Resolves the collected merges against the vocabulary, naming the culprit on failure.
void add_merges(const Collected& c, tok::BpeModel& bpe) {
  std::string missing;
  const int64_t bad = bpe.add_merges(c.merges, &missing);
  if (bad < 0) return;
  const size_t i = size_t(bad);
  const std::string merge =
      tok::bytes_to_symbols(c.merges.left(i)) + " " + tok::bytes_to_symbols(c.merges.right(i));
  const std::string place = c.merge_lines.empty() ? "model.merges[" + std::to_string(i) + "]"
                                                  : "line " + std::to_string(c.merge_lines[i]);
  fail(c.merges_file, ": ", place, ": merge ", shown(merge), " uses ",
       shown(tok::bytes_to_symbols(missing)), ", which is not in the vocabulary");
}

// ---------------------------------------------------------------------------------------
// tokenizer_config.json

// Its "padding_side" ("left" or "right"; absent: right) and its "added_tokens_decoder".
void read_tokenizer_config(std::string_view text, const std::string& file, Collected& out) {
  json config;
  try {
    config = json::parse(text);
  } catch (const json::exception& e) {
    fail(file, ": not valid JSON: ", e.what());
  }
  check(config.is_object(), file, ": expected a JSON object");
  if (auto side = config.find("padding_side"); side != config.end()) {
    check(side->is_string() && (*side == "left" || *side == "right"), file,
          ": padding_side must be \"left\" or \"right\", got ", side->dump());
    out.pads_left = *side == "left";
  }
  auto decoder = config.find("added_tokens_decoder");
  if (decoder == config.end()) return;
  check(decoder->is_object(), file, ": added_tokens_decoder must be an object");
  for (auto item : decoder->items()) {
    const std::string& key = item.key();
    const auto& value = item.value();  // not a structured binding: lambdas capture it below
    RawAddedToken t;
    t.where = file + ": added_tokens_decoder[\"" + key + "\"]";
    uint64_t id = 0;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    check(ec == std::errc() && end == key.data() + key.size() && id < kMaxTokenId, t.where,
          ": the key must be a token id");
    t.id = int64_t(id);
    check(value.is_object(), t.where, ": expected an object");
    auto flag = [&](const char* name) {
      auto it = value.find(name);
      if (it == value.end()) return false;
      check(it->is_boolean(), t.where, ": ", name, " must be true or false");
      return it->get<bool>();
    };
    auto content = value.find("content");
    check(content != value.end() && content->is_string(), t.where, ": needs a string \"content\"");
    t.content = content->get<std::string>();
    t.has_content = true;
    t.special = flag("special");
    t.lstrip = flag("lstrip");
    t.rstrip = flag("rstrip");
    t.single_word = flag("single_word");
    out.added.push_back(std::move(t));
  }
}

// ---------------------------------------------------------------------------------------
// Assembly

std::string file_in(const TokenizerFiles& files, const char* name) {
  return files.origin.empty() ? std::string(name) : (fs::path(files.origin) / name).string();
}

// Checks the added tokens from all sources and merges them by id.
std::vector<AddedToken> settle_added_tokens(const std::vector<RawAddedToken>& raw) {
  std::vector<AddedToken> added;
  std::unordered_map<int64_t, size_t> by_id;
  std::unordered_map<std::string, int64_t> id_of_content;
  for (const RawAddedToken& t : raw) {
    check(t.id >= 0, t.where, ": missing \"id\"");
    check(t.has_content && !t.content.empty(), t.where, ": missing or empty \"content\"");
    // These change how the text around the token is cut. The Qwen tokenizers set all of them
    // false; rather than quietly produce different ids for a tokenizer that sets them, say so.
    check(!t.lstrip && !t.rstrip && !t.single_word, t.where, ": added token ", shown(t.content),
          " uses lstrip, rstrip or single_word, which this tokenizer does not support");
    auto [it, fresh] = id_of_content.emplace(t.content, t.id);
    check(it->second == t.id, t.where, ": added token ", shown(t.content), " has two ids, ",
          it->second, " and ", t.id);
    auto seen = by_id.find(t.id);
    if (seen != by_id.end()) {
      // The same token listed by tokenizer.json and tokenizer_config.json: the first wins.
      check(added[seen->second].content == t.content, t.where, ": id ", t.id, " is ",
            shown(t.content), " here but ", shown(added[seen->second].content), " elsewhere");
      continue;
    }
    by_id.emplace(t.id, added.size());
    added.push_back({int32_t(t.id), t.content, t.special});
  }
  std::sort(added.begin(), added.end(),
            [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return added;
}

// An added token may share its id with a vocabulary entry only when it is that entry (GPT-2
// style files list <|endoftext|> in both); otherwise encoding and decoding would disagree.
void check_added_against_vocabulary(const std::vector<RawAddedToken>& raw,
                                    const tok::BpeModel& bpe) {
  for (const RawAddedToken& t : raw) {
    const std::optional<std::string_view> bytes = bpe.bytes_of(int32_t(t.id));
    if (bytes && *bytes != t.content)
      fail(t.where, ": id ", t.id, " is the added token ", shown(t.content),
           " here but the vocabulary's ", shown(tok::bytes_to_symbols(*bytes)));
  }
}

void load_vocab(const TokenizerFiles& files, tok::BpeModel& bpe, Collected& c) {
  using Layout = TokenizerJsonReader::Layout;
  const bool fast = files.tokenizer_json.has_value();
  c.vocab_file = file_in(files, fast ? "tokenizer.json" : "vocab.json");
  c.merges_file = file_in(files, fast ? "tokenizer.json" : "merges.txt");
  if (!fast) {
    check(files.vocab_json.has_value(), c.vocab_file,
          " is missing (and there is no tokenizer.json)");
    check(files.merges_txt.has_value(), c.merges_file,
          " is missing (and there is no tokenizer.json)");
  }
  const std::string_view text = fast ? *files.tokenizer_json : *files.vocab_json;
  // Every vocabulary entry has a colon, so counting them bounds the size closely enough to
  // allocate the tables once.
  bpe.reserve_vocabulary(size_t(std::count(text.begin(), text.end(), ':')));
  TokenizerJsonReader reader(fast ? Layout::kTokenizerJson : Layout::kVocabJson, c.vocab_file, bpe,
                             c);
  json::sax_parse(text, &reader);
  if (fast) {
    check(c.merges.size() > 0, c.vocab_file, ": model.merges is missing or empty");
  }
  check(reader.vocab_entries() > 0, c.vocab_file, fast ? ": model.vocab" : "",
        fast ? " is missing or empty" : ": the vocabulary is empty");
  const int missing_byte = bpe.finish_vocabulary();
  check(missing_byte < 0, c.vocab_file, ": no token for the single byte 0x", std::hex, missing_byte,
        std::dec, " (", shown(tok::bytes_to_symbols(std::string(1, char(missing_byte)))),
        "); a byte-level vocabulary needs all 256");
}

// ---------------------------------------------------------------------------------------
// tokenizer.json's pipeline around the model

// A field of a pipeline part, or nullptr when it is absent or null.
const json* field(const json& part, const char* name) {
  if (!part.is_object()) return nullptr;
  auto it = part.find(name);
  return it == part.end() || it->is_null() ? nullptr : &*it;
}

std::string type_of(const json& part) {
  const json* t = field(part, "type");
  return t && t->is_string() ? t->get<std::string>() : std::string();
}

// normalizer: absent (Qwen2's NFC, built in), null (none) or {"type": "NFC"}. Returns
// whether the text is NFC-normalised.
bool read_normalizer(const Collected& c, const std::string& file) {
  if (!c.normalizer) return true;
  if (c.normalizer->is_null()) return false;
  check(type_of(*c.normalizer) == "NFC", file, ": normalizer: ", shown(c.normalizer->dump()),
        " is not supported (only null or NFC)");
  return true;
}

// pre_tokenizer: absent (Qwen2's pattern, built in) or
//   Sequence[Split(Regex(PATTERN), "Isolated", invert false),
//            ByteLevel(add_prefix_space false, use_regex false)]
// which is what both Qwen2's files and transformers' Tekken converter write.
tok::Pretokenizer read_pre_tokenizer(const Collected& c, const std::string& file) {
  if (!c.pre_tokenizer) return tok::Pretokenizer();
  const json& pre = *c.pre_tokenizer;
  const char* expected =
      " (expected a Sequence of a Split on a Regex, \"Isolated\", then a ByteLevel)";
  const json* list = type_of(pre) == "Sequence" ? field(pre, "pretokenizers") : nullptr;
  check(list && list->is_array() && list->size() == 2, file, ": pre_tokenizer: ", shown(pre.dump()),
        " is not supported", expected);
  const json& split = (*list)[0];
  const json& byte_level = (*list)[1];
  const std::string at = file + ": pre_tokenizer.pretokenizers";
  check(type_of(split) == "Split", at, "[0]: ", shown(split.dump()), " is not supported", expected);
  const json* pattern = field(split, "pattern");
  const json* regex = pattern ? field(*pattern, "Regex") : nullptr;
  check(regex && regex->is_string(), at, "[0].pattern: ", shown(pattern ? pattern->dump() : "null"),
        " is not supported (only {\"Regex\": \"...\"})");
  const json* behavior = field(split, "behavior");
  check(behavior && *behavior == "Isolated", at,
        "[0].behavior: ", shown(behavior ? behavior->dump() : "null"),
        " is not supported (only \"Isolated\")");
  const json* invert = field(split, "invert");
  check(!invert || *invert == false, at, "[0].invert: only false is supported");
  check(type_of(byte_level) == "ByteLevel", at, "[1]: ", shown(byte_level.dump()),
        " is not supported", expected);
  for (const char* flag : {"add_prefix_space", "use_regex"}) {
    const json* v = field(byte_level, flag);
    check(!v || *v == false, at, "[1].", flag,
          ": only false is supported (the Split alone cuts the text, and adds no space)");
  }
  return tok::Pretokenizer(regex->get<std::string>(), at + "[0].pattern.Regex");
}

// decoder: absent, null or ByteLevel (the tokens' bytes, which is what decode() gives).
void read_decoder(const Collected& c, const std::string& file) {
  if (!c.decoder || c.decoder->is_null()) return;
  check(type_of(*c.decoder) == "ByteLevel", file, ": decoder: ", shown(c.decoder->dump()),
        " is not supported (only ByteLevel)");
}

}  // namespace

Tokenizer::Tokenizer(const TokenizerFiles& files) {
  auto impl = std::make_unique<Impl>();
  Collected c;
  load_vocab(files, impl->bpe, c);
  if (!files.tokenizer_json) read_merges_txt(*files.merges_txt, c.merges_file, c);
  add_merges(c, impl->bpe);
  check(impl->bpe.merge_count() > 0, c.merges_file, ": there are no merges");
  impl->bpe.set_ignore_merges(c.ignore_merges);
  impl->nfc = read_normalizer(c, c.vocab_file);
  impl->pretokenizer = read_pre_tokenizer(c, c.vocab_file);
  read_decoder(c, c.vocab_file);
  if (files.tokenizer_config_json)
    read_tokenizer_config(*files.tokenizer_config_json, file_in(files, "tokenizer_config.json"),
                          c);
  impl->pads_left = c.pads_left;
  impl->added = settle_added_tokens(c.added);
  check_added_against_vocabulary(c.added, impl->bpe);
  impl->index_added_tokens();
  impl_ = std::move(impl);
}

Tokenizer Tokenizer::from_directory(const fs::path& dir) {
  std::error_code ec;
  check(fs::is_directory(dir, ec), "tokenizer directory ", dir.string(), " does not exist");
  TokenizerFiles files;
  files.origin = dir.string();
  // Mapped rather than read: the parsers only scan the text once, so a copy is wasted time.
  std::vector<MappedFile> mapped;
  mapped.reserve(4);
  auto map_if_present = [&](const char* name, std::optional<std::string_view>& slot) {
    const fs::path path = dir / name;
    if (!fs::exists(path, ec)) return;
    mapped.emplace_back(path);
    slot =
        std::string_view(reinterpret_cast<const char*>(mapped.back().data()), mapped.back().size());
  };
  map_if_present("vocab.json", files.vocab_json);
  map_if_present("merges.txt", files.merges_txt);
  map_if_present("tokenizer_config.json", files.tokenizer_config_json);
  map_if_present("tokenizer.json", files.tokenizer_json);
  return Tokenizer(files);
}

}  // namespace klein
