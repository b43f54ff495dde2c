#include "families/flux2_dev/family.h"

#include "families/flux2/stages.h"
#include "families/flux2_dev/prompt.h"

namespace klein {

namespace {

// Text to image and references; one pass per step, the guidance scale given to the model.
constexpr Flux2Pipeline kDev{"FLUX.2-dev",
                             dev_chat_text,
                             tokenize_dev_prompt,
                             kDevMaxTokens,
                             /*image_to_image=*/false,
                             /*embedded_guidance=*/true,
                             dev_upsample_chat,
                             dev_upsample_style};

}  // namespace

const FamilyStages& flux2_dev::stages() {
  static const std::unique_ptr<FamilyStages> stages = flux2_stages(kDev);
  return *stages;
}

}  // namespace klein
