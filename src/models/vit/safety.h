#pragma once
// The decision BFL's FLUX.2 reference takes from the classifier (flux2's text_encoder.py):
// an image is flagged when the "nsfw" score is strictly greater than NSFW_THRESHOLD, 0.85.
#include <string>

#include "formats/image/image.h"
#include "models/vit/vit.h"
#include "ops/compute.h"
#include "weights/safety_model.h"

namespace klein::vit {

inline constexpr double kNsfwThreshold = 0.85;

struct SafetyVerdict {
  std::string label;     // the top-scoring label ("normal" or "nsfw")
  float nsfw = 0;        // the "nsfw" probability
  bool flagged = false;  // nsfw > threshold
  double threshold = kNsfwThreshold;
};

// Throws unless 0 <= threshold <= 1; `option` names it ("--threshold").
void check_threshold(double threshold, const std::string& option);

// The verdict from the scores (`c` says which label is which).
SafetyVerdict judge(const Classification& scores, const VitConfig& c,
                    double threshold = kNsfwThreshold);

// An image as load_image gives it (or a decoded one: tensor_to_image_truncated) through the
// preprocessing and the classifier.
Classification classify_image(const SafetyModel& model, const Image& rgb, Compute& cx);

}  // namespace klein::vit
