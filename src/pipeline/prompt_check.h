#pragma once
// The prompt check of BFL's FLUX.2 reference (black-forest-labs/flux2 at ab7cca68,
// src/flux2/text_encoder.py, Mistral3SmallEmbedder.test_txt): the text encoder's language
// model is asked, with BFL's content-filter system message and its text-integrity request
// (src/flux2/system_messages.py: SYSTEM_PROMPT_CONTENT_FILTER, PROMPT_TEXT_INTEGRITY with the
// prompt put in), whether the prompt names copyrighted characters, trademarks or living public
// figures. The answer is one greedy token among "yes" and "no" only (BFL's
// yes_no_logit_processor lowers every other score below both; argmax ties go to the lower id),
// and "yes" flags the prompt.
//
// The chat is the family's (FamilyStages::upsample_chat: Qwen3's with thinking off for
// FLUX.2-klein and Z-Image; Mistral's for FLUX.2-dev, which is the model BFL asks): about 260
// tokens, most of them BFL's fixed text, whose keys and values PromptChecker keeps.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "models/qwen3/language_model.h"
#include "ops/compute.h"
#include "pipeline/pipeline.h"

namespace klein {

// BFL's SYSTEM_PROMPT_CONTENT_FILTER, verbatim (its leading and trailing newline included).
std::string_view prompt_check_system();
// BFL's PROMPT_TEXT_INTEGRITY with `prompt` where it says {prompt}.
std::string prompt_check_request(std::string_view prompt);

// What BFL's generate picks from the two scores: "yes" (true) when its logit is above "no"'s,
// or equal with the lower id.
bool prompt_check_says_yes(float yes_logit, float no_logit, int32_t yes_id, int32_t no_id);

struct PromptCheck {
  bool flagged = false;       // the model answered "yes"
  float yes_logit = 0, no_logit = 0;
  int32_t yes_id = -1, no_id = -1;
  int chat_tokens = 0;        // of the chat
  int reused_tokens = 0;      // of them, those whose keys and values an earlier check computed
                              // (kept by the PromptChecker, or read from the prompt cache)
  bool prefix_from_cache = false;  // those were read from the prompt cache directory
  std::string store_error;    // why they could not be stored there (the check is still valid)
  double seconds = 0;
};

// Whether the model can check prompts; when not, a sentence saying why and what to do.
std::string prompt_check_unavailable(const Model& model);

// The answer to a chat already rendered and tokenized (check_prompt's second half): one
// prefill and the next token's "yes" and "no" logits.
PromptCheck prompt_check_answer(WeightStore& weights, const Tokenizer& tokenizer, Compute& cx,
                                std::span<const int32_t> chat);

// Asks the model about prompts, one after another. Every check's chat starts with the same
// tokens (the template and BFL's text up to the prompt: about 245 of a check's 260), so their
// keys and values are computed once and kept for every later check; with a prompt cache
// directory (qwen3::PromptCache, keyed by the weights' identity and those tokens) they are
// read from it, or stored there for the next run. A check then costs the prefill of the
// prompt and the chat's last few tokens, and the logits of one position. Throws when the
// model cannot run as a language model or its tokenizer does not write "yes" and "no" as one
// token each (prompt_check_unavailable).
class PromptChecker {
 public:
  PromptChecker(Model& model, Compute& cx,
                std::optional<std::filesystem::path> cache_dir = std::nullopt);
  PromptCheck check(std::string_view prompt);
  // The chat's tokens before the prompt that every check shares.
  int fixed_tokens() const { return int(prefix_.size()); }

 private:
  std::vector<int32_t> chat(std::string_view prompt) const;
  void make_room(size_t tokens);
  bool load_prefix();
  std::string store_prefix();

  Model& model_;
  Compute& cx_;
  std::optional<std::filesystem::path> cache_dir_;
  std::vector<int32_t> prefix_;
  std::unique_ptr<qwen3::LanguageModel> lm_;
  bool prefix_ready_ = false;  // lm_'s cache holds prefix_'s keys and values
};

// One check, nothing kept (PromptChecker for one prompt).
PromptCheck check_prompt(Model& model, Compute& cx, std::string_view prompt,
                         std::optional<std::filesystem::path> cache_dir = std::nullopt);

// The sentence a flagged prompt stops with (BFL's CLI's, naming the option that asked).
std::string prompt_check_refusal(std::string_view option);

// What a flagged prompt throws where it stops the work (the CLI's exit status 2, the server's
// 422), with the check that flagged it.
class PromptFlagged : public Error {
 public:
  PromptFlagged(const std::string& message, PromptCheck check)
      : Error(message), check(check) {}
  PromptCheck check;
};

}  // namespace klein
