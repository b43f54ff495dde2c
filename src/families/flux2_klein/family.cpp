#include "families/flux2_klein/family.h"

#include "families/flux2/stages.h"
#include "families/flux2_klein/checkpoint.h"
#include "families/flux2_klein/prompt.h"

namespace klein {

namespace {

// Text to image, references, image to image and inpainting; CFG where the model is not
// distilled.
constexpr Flux2Pipeline kKlein{"FLUX.2-klein",
                               klein_chat_text,
                               tokenize_klein_prompt,
                               kKleinMaxTokens,
                               /*image_to_image=*/true,
                               /*embedded_guidance=*/false};

}  // namespace

const ModelFamily& flux2_klein::checkpoint() {
  static const Flux2Klein family;
  return family;
}

const FamilyStages& flux2_klein::stages() {
  static const std::unique_ptr<FamilyStages> stages = flux2_stages(kKlein);
  return *stages;
}

}  // namespace klein
