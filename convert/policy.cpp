#include "convert/policy.h"

#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <sstream>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "core/error.h"
#include "formats/gguf_types.h"
#include "quant/types.h"
#include "weights/family.h"

namespace klein::convert {

namespace {

// Built-in defaults. Kept as policy text so that the record of a conversion and
// `klein convert --print-policy` show exactly the rules that ran.
// The rules every family shares; each family's transformer rules (ModelFamily::
// precision_defaults) follow, then the text encoder's and the VAE's.
const char* const kSharedHead =
    R"(# Built-in defaults (after the user's rules; first match wins).
# The tiny autoencoder's decoder beside the model: 1.2 M values, kept exactly as published.
tiny_vae.*                                 f32
# Biases, norm weights, BatchNorm statistics: tiny, and every value matters.
@1d                                        >=bf16
)";
const char* const kSharedTail =
    R"(# Token embedding table: rows are looked up, never multiplied; q8 keeps them close.
text_encoder.model.embed_tokens.weight     >=q8
# VAE: small, convolutions want floats.
vae.*                                      >=bf16
# The safety classifier: its embeddings (patch projection, position table, class token) and
# its head are small and read once; its encoder's matrices take the type.
safety.vit.embeddings.*                    >=bf16
safety.classifier.*                        >=bf16
)";

int precision_rank(DType t) {
  const quant::StorageType* s = quant::find_storage_type(t);
  return s ? s->precision_rank : -1;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

// PCRE2 anchored at both ends (the whole name), UTF-8; matching is bounded by a match limit
// and a depth limit, so a pathological pattern fails with its rule named instead of running
// for minutes or exhausting the stack.
class PolicyRegex {
 public:
  PolicyRegex(const std::string& pattern, const std::string& where) : where_(where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_ANCHORED | PCRE2_ENDANCHORED, &error, &offset,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail(where, ": invalid regular expression \"", pattern, "\" at offset ", offset, ": ",
           reinterpret_cast<const char*>(message));
    }
    context_ = pcre2_match_context_create(nullptr);
    pcre2_set_match_limit(context_, kMatchLimit);
    pcre2_set_depth_limit(context_, kDepthLimit);
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (!context_ || !data_) {
      release();
      fail(where, ": out of memory compiling a regular expression");
    }
  }
  ~PolicyRegex() { release(); }
  PolicyRegex(const PolicyRegex&) = delete;
  PolicyRegex& operator=(const PolicyRegex&) = delete;

  bool matches(const std::string& name) const {
    const std::lock_guard lock(mutex_);  // the match data is shared
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0,
                               0, data_, context_);
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
      fail(where_, ": the regular expression backtracks too much on ", name,
           " (simplify the pattern)");
    fail(where_, ": matching ", name, " failed (PCRE2 error ", rc, ")");
  }

 private:
  static constexpr uint32_t kMatchLimit = 1000000;
  static constexpr uint32_t kDepthLimit = 5000;
  void release() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_code_free(code_);
  }
  std::string where_;
  pcre2_code* code_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_match_data* data_ = nullptr;
  mutable std::mutex mutex_;
};

namespace {

bool matches(const PolicyRule& r, const std::string& name, const Shape& shape) {
  switch (r.selector) {
    case PolicyRule::Selector::Vector: return shape.size() < 2;
    case PolicyRule::Selector::Glob: return ::fnmatch(r.pattern.c_str(), name.c_str(), 0) == 0;
    case PolicyRule::Selector::Regex: return r.regex->matches(name);
  }
  return false;
}

// Policies are UTF-8 text (they are kept in the container's metadata, which is JSON).
void check_utf8(std::string_view line, const std::string& where) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(line.data());
  utf8proc_ssize_t at = 0;
  const auto size = utf8proc_ssize_t(line.size());
  while (at < size) {
    utf8proc_int32_t c = 0;
    const utf8proc_ssize_t n = utf8proc_iterate(p + at, size - at, &c);
    check(n > 0, where, ": not valid UTF-8 text (byte ", at + 1, " of the line)");
    at += n;
  }
}

}  // namespace

DType parse_storage_type(std::string_view s, const std::string& where) {
  if (const quant::StorageType* t = quant::find_storage_type(s)) return t->type;
  std::string names;
  for (const quant::StorageType& t : quant::storage_types())
    names += (names.empty() ? "" : ", ") + std::string(t.name);
  fail(where, ": unknown storage type \"", s, "\" (expected one of ", names, ")");
}

std::string storage_type_name(DType t) {
  const quant::StorageType* s = quant::find_storage_type(t);
  return s ? std::string(s->name) : lower(dtype_name(t));
}

DType keep_precision(DType stored, const std::string& tensor) {
  switch (stored) {
    case DType::F32:
    case DType::BF16:
    case DType::F16:
    case DType::Q8:
    case DType::Q4: return stored;
    case DType::F8_E4M3:
    case DType::F8_E5M2: return DType::Q8;
    default: break;
  }
  fail("-t keep: tensor ", tensor, " is stored as ", dtype_name(stored),
       ", which has no storage type to keep it in; give -t q4|q8|bf16|f16|f32");
}

DType keep_precision_ggml(uint32_t ggml_type, const std::string& tensor) {
  const std::optional<gguf::TypeInfo> t = gguf::type_info(ggml_type);
  check(t.has_value() && t->block_elems > 0, "-t keep: tensor ", tensor,
        " has an unknown GGML type ", ggml_type);
  return uint64_t(t->block_bytes) * 8 <= uint64_t(5) * t->block_elems ? DType::Q4 : DType::Q8;
}

std::vector<PolicyRule> parse_policy(std::string_view text, const std::string& origin) {
  std::vector<PolicyRule> rules;
  std::istringstream in{std::string(text)};
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string where = origin + ":" + std::to_string(number);
    check_utf8(line, where);
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string selector, type, extra;
    if (!(words >> selector)) continue;  // blank or comment
    check(bool(words >> type), where, ": expected \"<pattern> <type>\", got only \"", selector,
          "\"");
    check(!(words >> extra), where, ": unexpected \"", extra, "\" after the type");
    PolicyRule r;
    r.pattern = selector;
    r.origin = where;
    r.text = selector + " " + type;
    if (selector == "@1d") {
      r.selector = PolicyRule::Selector::Vector;
    } else if (selector.rfind("re:", 0) == 0) {
      r.selector = PolicyRule::Selector::Regex;
      r.regex = std::make_shared<const PolicyRegex>(selector.substr(3), where);
    } else {
      check(selector[0] != '@', where, ": unknown selector ", selector, " (the only one is @1d)");
      r.selector = PolicyRule::Selector::Glob;
    }
    if (type.rfind(">=", 0) == 0) {
      r.at_least = true;
      type = type.substr(2);
    }
    r.type = parse_storage_type(type, where);
    rules.push_back(std::move(r));
  }
  return rules;
}

const std::string& default_policy_text() {
  static const std::string text = [] {
    std::string t = kSharedHead;
    for (const ModelFamily* f : model_families()) t += f->precision_defaults();
    return t + kSharedTail;
  }();
  return text;
}

PrecisionPolicy::PrecisionPolicy() : rules_(parse_policy(default_policy_text(), "default")) {}

PrecisionPolicy PrecisionPolicy::with_user_rules(std::string_view text, const std::string& origin) {
  PrecisionPolicy p;
  std::vector<PolicyRule> user = parse_policy(text, origin);
  user.insert(user.end(), p.rules_.begin(), p.rules_.end());
  p.rules_ = std::move(user);
  return p;
}

PrecisionPolicy::Choice PrecisionPolicy::choose(const std::string& name, const Shape& shape,
                                                DType target) const {
  for (const auto& r : rules_) {
    if (!matches(r, name, shape)) continue;
    if (!r.at_least) return {r.type, &r};
    return {precision_rank(target) >= precision_rank(r.type) ? target : r.type, &r};
  }
  return {target, nullptr};
}

std::string PrecisionPolicy::text() const {
  std::string out;
  for (const auto& r : rules_) out += r.text + "    # " + r.origin + "\n";
  return out;
}

}  // namespace klein::convert
