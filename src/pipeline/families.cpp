// The pipeline stages of each model family (stages.h), by ModelConfig::family: the one place
// that maps a family to the code that runs it. The family's checkpoint side is listed in
// weights/family.cpp.
#include "core/error.h"
#include "pipeline/stages.h"

namespace klein {

const FamilyStages& stages_for(const ModelConfig& config) {
  if (config.family == "flux2-klein") return flux2_stages();
  if (config.family == "flux2-dev") return flux2_dev_stages();
  if (config.family == "z-image") return zimage_stages();
  fail("model family \"", config.family, "\" has no pipeline in this build");
}

Capabilities capabilities(const Model& model) {
  const ModelConfig& config = model.weights->config();
  Capabilities c = stages_for(config).capabilities(config);
  c.family = config.family;
  return c;
}

}  // namespace klein
