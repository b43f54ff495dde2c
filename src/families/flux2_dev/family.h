#pragma once
// FLUX.2-dev (diffusers' Flux2Pipeline), as src/families/registry.cpp registers it: its
// checkpoints (checkpoint.cpp: FLUX.2-klein's with a guidance embedder and Mistral-Small-3.1's
// language model as text encoder) and its stages (the FLUX.2 stages with its chat and the
// guidance embedded: family.cpp).
#include "pipeline/stages.h"
#include "weights/family.h"

namespace klein::flux2_dev {

const ModelFamily& checkpoint();
const FamilyStages& stages();

}  // namespace klein::flux2_dev
