#pragma once
// Z-Image's pipeline stages (stages.cpp: diffusers' ZImagePipeline).
#include "pipeline/stages.h"

namespace klein::zimage {

const FamilyStages& stages();

}  // namespace klein::zimage
