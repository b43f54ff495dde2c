#include "models/vit/safety.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "models/vit/preprocess.h"

namespace klein::vit {

void check_threshold(double threshold, const std::string& option) {
  check(std::isfinite(threshold) && threshold >= 0.0 && threshold <= 1.0, option, " ", threshold,
        " is outside [0, 1] (a probability; BFL's is 0.85)");
}

SafetyVerdict judge(const Classification& scores, const VitConfig& c, double threshold) {
  check_threshold(threshold, "safety threshold");
  const int64_t nsfw = c.label_id("nsfw");
  check(nsfw >= 0 && size_t(nsfw) < scores.probs.size() && scores.probs.size() == c.labels.size(),
        "safety classifier: ", scores.probs.size(), " scores for ", c.labels.size(),
        " labels, or no \"nsfw\" label");
  SafetyVerdict v;
  const auto top = std::max_element(scores.probs.begin(), scores.probs.end());
  v.label = c.labels[size_t(top - scores.probs.begin())];
  v.nsfw = scores.probs[size_t(nsfw)];
  v.threshold = threshold;
  v.flagged = double(v.nsfw) > threshold;
  return v;
}

Classification classify_image(const SafetyModel& model, const Image& rgb, Compute& cx) {
  check(model.store != nullptr, "safety classifier: no model");
  return classify(*model.store, model.config, pixel_values(rgb, model.processor), cx);
}

}  // namespace klein::vit
