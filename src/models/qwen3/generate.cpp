// Token choice and the decode loop (generate.h). The warpers follow transformers'
// logits_process.py: temperature divides the float32 scores; top-k drops every score below
// the k-th largest (ties with it stay); top-p sorts ascending, takes the softmax and its
// running sum, and drops the tokens whose running sum is <= 1 - top_p, never the largest.
#include "models/qwen3/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace klein::qwen3 {

namespace {

// float32 softmax of scores (-inf entries get 0), with the sum in double.
std::vector<float> softmax(std::span<const float> scores) {
  float max = -std::numeric_limits<float>::infinity();
  for (float s : scores) max = std::max(max, s);
  std::vector<double> e(scores.size());
  double sum = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    e[i] = std::isinf(scores[i]) && scores[i] < 0 ? 0.0 : std::exp(double(scores[i]) - max);
    sum += e[i];
  }
  std::vector<float> p(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) p[i] = float(e[i] / sum);
  return p;
}

}  // namespace

int32_t argmax(std::span<const float> logits) {
  check(!logits.empty(), "no logits to choose from");
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

std::vector<Candidate> sampling_support(std::span<const float> logits, const SamplingOptions& o) {
  check(o.temperature > 0 && std::isfinite(o.temperature), "temperature: expected a positive "
        "number, got ", o.temperature);
  check(o.top_p > 0 && o.top_p <= 1, "top-p: expected a number in (0, 1], got ", o.top_p);
  check(o.top_k >= 0, "top-k: expected 0 (off) or more, got ", o.top_k);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(logits.begin(), logits.end());
  if (o.temperature != 1.0f)
    for (float& s : scores) s = s / o.temperature;
  if (o.top_k > 0 && size_t(o.top_k) < scores.size()) {
    std::vector<float> sorted = scores;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(),
                     std::greater<float>());
    const float kth = sorted[size_t(o.top_k - 1)];
    for (float& s : scores)
      if (s < kth) s = neg_inf;
  }
  if (o.top_p < 1.0f) {
    std::vector<int32_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return scores[size_t(a)] < scores[size_t(b)]; });
    std::vector<float> sorted(scores.size());
    for (size_t i = 0; i < order.size(); ++i) sorted[i] = scores[size_t(order[i])];
    const std::vector<float> p = softmax(sorted);
    const float cut = 1.0f - o.top_p;
    float running = 0;
    for (size_t i = 0; i + 1 < order.size(); ++i) {  // the largest always stays
      running += p[i];
      if (running <= cut) scores[size_t(order[i])] = neg_inf;
    }
  }
  const std::vector<float> probs = softmax(scores);
  std::vector<Candidate> support;
  for (size_t i = 0; i < probs.size(); ++i)
    if (probs[i] > 0) support.push_back({int32_t(i), probs[i]});
  std::sort(support.begin(), support.end(), [](const Candidate& a, const Candidate& b) {
    return a.prob != b.prob ? a.prob > b.prob : a.id < b.id;
  });
  return support;
}

int32_t draw(const std::vector<Candidate>& support, double u) {
  check(!support.empty(), "no token to draw from");
  double total = 0;
  for (const Candidate& c : support) total += double(c.prob);
  double running = 0;
  for (const Candidate& c : support) {
    running += double(c.prob);
    if (u * total < running) return c.id;
  }
  return support.back().id;
}

int32_t TokenPicker::pick(std::span<const float> logits) {
  if (!o_.sample) return argmax(logits);
  const double u = double(rng_() >> 11) * 0x1.0p-53;
  return draw(sampling_support(logits, o_), u);
}

GenerationResult generate(LanguageModel& lm, std::span<const int32_t> prompt,
                          int max_new_tokens, TokenPicker& picker,
                          std::span<const int32_t> stop,
                          const std::function<void(int32_t)>& on_token) {
  check(max_new_tokens > 0, "max new tokens: expected 1 or more, got ", max_new_tokens);
  GenerationResult r;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  std::vector<float> logits = lm.prefill(prompt);
  r.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (int i = 0; i < max_new_tokens; ++i) {
    const int32_t id = picker.pick(logits);
    r.ids.push_back(id);
    if (on_token) on_token(id);
    if (std::find(stop.begin(), stop.end(), id) != stop.end()) {
      r.stopped = true;
      break;
    }
    if (i + 1 < max_new_tokens) logits = lm.step(id);
  }
  r.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace klein::qwen3
