#include "tokenizer/chat.h"

#include "core/error.h"
#include "tokenizer/byte_level.h"

namespace klein {

namespace {

// How much of the dropped text the warning quotes, so the user can see where the cut fell.
constexpr size_t kQuotedBytes = 48;

// The first `max_bytes` bytes of `text`, not cutting a character in two.
std::string_view utf8_head(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  while (end > 0 && (uint8_t(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

std::string truncation_warning(const Tokenizer& tokenizer, const std::vector<int32_t>& all,
                               int kept) {
  const std::span<const int32_t> dropped(all.data() + kept, all.size() - size_t(kept));
  const std::string dropped_text = tokenizer.decode(dropped);
  const std::string_view head = utf8_head(dropped_text, kQuotedBytes);
  return "prompt too long: " + std::to_string(all.size()) +
         " tokens with the chat template, but the text encoder reads " + std::to_string(kept) +
         "; the last " + std::to_string(dropped.size()) + " are dropped, starting at \"" +
         std::string(head) + (head.size() < dropped_text.size() ? "...\"" : "\"");
}

}  // namespace

PromptTokens tokenize_chat_text(const Tokenizer& tokenizer, const std::string& chat_text,
                                int max_tokens, const ChatPadding& padding) {
  check(max_tokens > 0, "the maximum prompt length must be positive, got ", max_tokens);
  PromptTokens out;
  out.pad_id = tokenizer.token_id(padding.pad_token);
  check(out.pad_id >= 0, "the tokenizer has no ", padding.pad_token, " token to pad prompts with");

  const std::vector<int32_t> all = tokenizer.encode(chat_text);
  const int total = int(all.size());
  out.real_tokens = std::min(total, max_tokens);
  out.dropped = total - out.real_tokens;
  if (out.dropped > 0) out.warning = truncation_warning(tokenizer, all, out.real_tokens);

  out.ids.assign(size_t(max_tokens), out.pad_id);
  out.mask.assign(size_t(max_tokens), 0);
  const int first = padding.left ? max_tokens - out.real_tokens : 0;
  for (int i = 0; i < out.real_tokens; ++i) {
    out.ids[size_t(first + i)] = all[size_t(i)];
    out.mask[size_t(first + i)] = 1;
  }
  return out;
}

std::string qwen3_chat_text(std::string_view system, std::string_view user, bool thinking) {
  std::string text;
  if (!system.empty()) {
    text += "<|im_start|>system\n";
    text += system;
    text += "<|im_end|>\n";
  }
  text += "<|im_start|>user\n";
  text += user;
  text += "<|im_end|>\n<|im_start|>assistant\n";
  if (!thinking) text += "<think>\n\n</think>\n\n";
  return text;
}

std::string clean_up_tokenization(std::string text) {
  static const std::pair<std::string_view, std::string_view> kReplacements[] = {
      {" .", "."},     {" ?", "?"},     {" !", "!"},     {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"},   {" 's", "'s"},   {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kReplacements) {
    std::string out;
    size_t at = 0;
    for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size()) {
      out.append(text, at, hit - at);
      out.append(to);
    }
    out.append(text, at, std::string::npos);
    text = std::move(out);
  }
  return text;
}

}  // namespace klein
