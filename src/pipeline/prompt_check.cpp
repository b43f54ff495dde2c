// The prompt check (prompt_check.h): BFL's chat -> one prefill -> the "yes" and "no" logits.
#include "pipeline/prompt_check.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "models/qwen3/language_model.h"
#include "models/qwen3/prompt_cache.h"
#include "pipeline/stages.h"
#include "pipeline/upsample.h"

namespace klein {
namespace {

// black-forest-labs/flux2 ab7cca68018ad3ceadcace9d6ecb1bc1f6f46b4e,
// src/flux2/system_messages.py: SYSTEM_PROMPT_CONTENT_FILTER (not stripped) and
// PROMPT_TEXT_INTEGRITY (stripped), the text before and after its {prompt}.
constexpr std::string_view kContentFilter =
    "\nYou are Mistral Small 3, a Large Language Model (LLM) created by Mistral AI, a French "
    "startup headquartered in Paris.\nYour task is identifying images and text for copyright "
    "concerns and depictions of public personas.\n";

constexpr std::string_view kIntegrityBefore =
    "Task: Analyze a text prompt to identify potential copyright concerns or requests to "
    "depict living public figures.\n"
    "\n"
    "Output: Respond with only \"yes\" or \"no\"\n"
    "\n"
    "Criteria for \"Yes\":\n"
    "- The prompt explicitly names a character from copyrighted media (movies, TV, comics, "
    "games, etc.)\n"
    "- The prompt explicitly mentions a trademarked logo or brand\n"
    "- The prompt names or describes a specific living public figure (celebrities, "
    "politicians, athletes, influencers, etc.)\n"
    "\n"
    "Criteria for \"No\":\n"
    "- All other cases\n"
    "- When you cannot identify the specific copyrighted work or named individual\n"
    "\n"
    "Critical Requirements:\n"
    "1. You must be able to name the exact copyrighted work or specific person referenced\n"
    "2. General demographic descriptions or characteristics are not sufficient\n"
    "3. Analyze only the prompt text, not potential image outcomes\n"
    "4. Provide only the one-word answer: \"yes\" or \"no\"\n"
    "\n"
    "The prompt to check is:\n"
    "-----\n";

constexpr std::string_view kIntegrityAfter =
    "\n"
    "-----\n"
    "\n"
    "Does this prompt have copyright concerns or includes public figures?";

// The one id the tokenizer writes `word` as (BFL: tokenizer.encode(["yes", "no"],
// add_special_tokens=False), unpacked into two ids).
int32_t single_token(const Tokenizer& tokenizer, std::string_view word) {
  const std::vector<int32_t> ids = tokenizer.encode(word);
  check(ids.size() == 1, "the prompt check needs \"", word, "\" as one token of the model's "
        "tokenizer, which writes it as ", ids.size(), " tokens (the check reads the answer as "
        "one token, \"yes\" or \"no\", as BFL's does)");
  return ids[0];
}

}  // namespace

std::string_view prompt_check_system() { return kContentFilter; }

std::string prompt_check_request(std::string_view prompt) {
  std::string text(kIntegrityBefore);
  text += prompt;
  text += kIntegrityAfter;
  return text;
}

bool prompt_check_says_yes(float yes_logit, float no_logit, int32_t yes_id, int32_t no_id) {
  return yes_logit > no_logit || (yes_logit == no_logit && yes_id < no_id);
}

std::string prompt_check_unavailable(const Model& model) {
  std::string missing;
  if (!qwen3::can_generate(*model.weights, &missing))
    return "this model cannot check prompts: its text encoder lacks " + missing +
           " (a container keeps only the layers image generation reads; convert the "
           "checkpoint again with --keep-llm, or check from the diffusers directory)";
  for (const std::string_view word : {"yes", "no"})
    if (const size_t n = model.tokenizer.encode(word).size(); n != 1)
      return "this model cannot check prompts: the check reads the answer as one token, \"yes\" "
             "or \"no\", as BFL's does, and the model's tokenizer writes \"" + std::string(word) +
             "\" as " + std::to_string(n) + " tokens";
  return "";
}

namespace {

// The verdict of the logits after a check's chat.
void answer(const Tokenizer& tokenizer, const std::vector<float>& logits, PromptCheck& r) {
  r.yes_id = single_token(tokenizer, "yes");
  r.no_id = single_token(tokenizer, "no");
  check(size_t(r.yes_id) < logits.size() && size_t(r.no_id) < logits.size(),
        "the prompt check: the tokenizer's \"yes\" (", r.yes_id, ") or \"no\" (", r.no_id,
        ") is beyond the language model's ", logits.size(), " logits");
  r.yes_logit = logits[size_t(r.yes_id)];
  r.no_logit = logits[size_t(r.no_id)];
  check(std::isfinite(r.yes_logit) && std::isfinite(r.no_logit), "the prompt check: the "
        "language model's logits of \"yes\" and \"no\" are ", r.yes_logit, " and ", r.no_logit,
        " (not finite: the model's weights are broken)");
  r.flagged = prompt_check_says_yes(r.yes_logit, r.no_logit, r.yes_id, r.no_id);
}

}  // namespace

PromptCheck prompt_check_answer(WeightStore& weights, const Tokenizer& tokenizer, Compute& cx,
                                std::span<const int32_t> chat) {
  const auto start = std::chrono::steady_clock::now();
  PromptCheck r;
  qwen3::LanguageModel lm(weights, cx, int64_t(chat.size()));
  answer(tokenizer, lm.prefill(chat), r);
  r.chat_tokens = int(chat.size());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

PromptChecker::PromptChecker(Model& model, Compute& cx,
                             std::optional<std::filesystem::path> cache_dir)
    : model_(model), cx_(cx), cache_dir_(std::move(cache_dir)) {
  const std::string why = prompt_check_unavailable(model);
  klein::check(why.empty(), why);
  // The tokens every chat starts with: those the chats of prompts that begin unlike one
  // another share (a prompt's first characters may join the token before it: "\n" after
  // "-----\n"), less one for safety.
  std::vector<int32_t> common = chat("a");
  for (const char* probe : {"\n\n", "-", " ", "0", "\xe4\xb8\x80", "'", "\t"}) {
    const std::vector<int32_t> other = chat(probe);
    size_t n = 0;
    while (n < common.size() && n < other.size() && common[n] == other[n]) ++n;
    common.resize(n);
  }
  if (!common.empty()) common.pop_back();
  prefix_ = std::move(common);
}

std::vector<int32_t> PromptChecker::chat(std::string_view prompt) const {
  const FamilyStages& family = stages_for(model_.weights->config());
  return family.upsample_chat(model_.tokenizer, prompt_check_system(), prompt_check_request(prompt))
      .ids;
}

void PromptChecker::make_room(size_t tokens) {
  if (lm_ && size_t(lm_->max_tokens()) >= tokens) return;
  // Room for prompts of a few hundred tokens more than this one before it is made again.
  lm_ = std::make_unique<qwen3::LanguageModel>(*model_.weights, cx_, int64_t(tokens) + 256);
  prefix_ready_ = false;
}

namespace {

qwen3::PromptCacheKey prefix_key(const Model& model, const std::vector<int32_t>& prefix) {
  return {model.weights->identity() + "\nprompt check: the language model's keys and values",
          prefix, {}};
}

}  // namespace

bool PromptChecker::load_prefix() {
  if (!cache_dir_ || prefix_.empty()) return false;
  const std::optional<Tensor> rows =
      qwen3::PromptCache(*cache_dir_).load(prefix_key(model_, prefix_));
  if (!rows || rows->shape().size() != 4 || rows->dim(2) != int64_t(prefix_.size())) return false;
  lm_->restore_cache(*rows);
  return true;
}

std::string PromptChecker::store_prefix() {
  if (!cache_dir_ || prefix_.empty()) return "";
  try {
    qwen3::PromptCache(*cache_dir_)
        .store(prefix_key(model_, prefix_), lm_->cache_rows(int64_t(prefix_.size())));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

PromptCheck PromptChecker::check(std::string_view prompt) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = chat(prompt);
  make_room(ids.size());
  const bool shares = !prefix_.empty() && ids.size() > prefix_.size() &&
                      std::equal(prefix_.begin(), prefix_.end(), ids.begin());
  PromptCheck r;
  if (shares && !prefix_ready_) prefix_ready_ = r.prefix_from_cache = load_prefix();
  std::vector<float> logits;
  if (shares && prefix_ready_) {
    const std::span<const int32_t> rest(ids.data() + prefix_.size(), ids.size() - prefix_.size());
    logits = lm_->prefill_after(int64_t(prefix_.size()), rest);
    r.reused_tokens = int(prefix_.size());
  } else {
    // The whole chat: its first positions are then the fixed part's, kept for the next check
    // (and stored) when it starts as every chat does; a chat unlike the others overwrites them.
    logits = lm_->prefill(ids);
    prefix_ready_ = shares;
    if (shares) r.store_error = store_prefix();
  }
  answer(model_.tokenizer, logits, r);
  r.chat_tokens = int(ids.size());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

PromptCheck check_prompt(Model& model, Compute& cx, std::string_view prompt,
                         std::optional<std::filesystem::path> cache_dir) {
  return PromptChecker(model, cx, std::move(cache_dir)).check(prompt);
}

std::string prompt_check_refusal(std::string_view option) {
  return "the prompt was flagged by " + std::string(option) +
         " for potential copyright or public personas concerns (BFL's criteria: a named "
         "character of copyrighted media, a trademarked logo or brand, a living public "
         "figure); please choose another. Nothing was generated";
}

}  // namespace klein
