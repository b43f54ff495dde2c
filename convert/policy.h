#pragma once
// The precision policy: which storage type each tensor gets. A policy is a list of rules,
// one per line, the first rule that matches a tensor deciding:
//
//   # comment
//   <selector>  <type>
//
//   selector  a glob over the canonical tensor name (* ? [...], '*' also matches '.'),
//             re:<regex> (PCRE2, must match the whole name; bounded: a pattern that
//             backtracks too much is an error naming its rule, never a hang),
//             or @1d (any tensor with fewer than two dimensions: biases, norms, statistics)
//   type      f32 | bf16 | f16 | q8 | q4: exactly this type
//             >=q8, >=bf16, ...: at least this precise: the target type (-t) if it is at
//             least as precise, else this type. Precision order q4 < q8 < f16 = bf16 < f32.
//
// The user's rules (--policy FILE) come first; the built-in defaults (default_policy_text())
// follow; a tensor no rule matches gets the target type. The defaults keep what quantization
// hurts most at a float type (bf16, the published precision) when the target is quantized:
// 1-D tensors, the embedders, the shared modulation, the output layer, the VAE; and the token
// embedding table at least at q8.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein::convert {

// A compiled re: selector (PCRE2 with match and depth limits).
class PolicyRegex;

struct PolicyRule {
  enum class Selector { Glob, Regex, Vector };
  Selector selector = Selector::Glob;
  std::string pattern;                      // as written
  std::shared_ptr<const PolicyRegex> regex;  // Selector::Regex, compiled
  DType type = DType::BF16;
  bool at_least = false;  // ">=type"
  std::string origin;     // "policy.txt:3", "default:2"
  std::string text;       // the line as written, for records
};

// "f32", "bf16", "f16", "q8", "q4" (case-insensitive) -> DType; throws naming `where`.
DType parse_storage_type(std::string_view s, const std::string& where);
std::string storage_type_name(DType t);  // "bf16", ...

// -t keep: the storage type that keeps the precision class of a tensor stored as `stored`.
// Float types stay as they are (f32, bf16, f16); fp8 (F8_E4M3, F8_E5M2) becomes q8, the
// nearest of our types: int8 blocks of 32 with their own scale have a step of 1/127 of the
// block's largest value, finer than fp8's 3 (E4M3) or 2 (E5M2) mantissa bits on the values
// that dominate a product, at 8.5 bits a value (bf16, exact, would double the size). Q8 and
// Q4 stay. Throws naming `tensor` for a type it cannot keep.
DType keep_precision(DType stored, const std::string& tensor);
// The same for a GGUF tensor of GGML block type `ggml_type` (DType::GGML): q4 up to 5 bits a
// weight (Q2_K..Q4_K, Q4_0, Q4_1), q8 above (Q5_*, Q6_K): never fewer bits than the file had.
DType keep_precision_ggml(uint32_t ggml_type, const std::string& tensor);

class PrecisionPolicy {
 public:
  // The built-in defaults only.
  PrecisionPolicy();
  // The user's rules from `text` (read from `origin`), then the built-in defaults. Throws
  // naming origin:line for a malformed line.
  static PrecisionPolicy with_user_rules(std::string_view text, const std::string& origin);

  struct Choice {
    DType type;
    const PolicyRule* rule;  // nullptr: no rule matched, the target type
  };
  Choice choose(const std::string& name, const Shape& shape, DType target) const;

  const std::vector<PolicyRule>& rules() const { return rules_; }
  // The rules as policy-file text (what a record of the conversion stores).
  std::string text() const;

 private:
  std::vector<PolicyRule> rules_;
};

const std::string& default_policy_text();
std::vector<PolicyRule> parse_policy(std::string_view text, const std::string& origin);

}  // namespace klein::convert
