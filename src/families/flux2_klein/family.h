#pragma once
// FLUX.2-klein (4B and 9B; distilled, base and K/V: diffusers' Flux2KleinPipeline and its
// image-to-image, inpainting and K/V siblings), as src/families/registry.cpp registers it: its
// checkpoints (checkpoint.h) and its stages (the FLUX.2 stages with the Qwen3 chat of
// prompt.h and CFG for the base models).
#include "pipeline/stages.h"
#include "weights/family.h"

namespace klein::flux2_klein {

const ModelFamily& checkpoint();
const FamilyStages& stages();

}  // namespace klein::flux2_klein
