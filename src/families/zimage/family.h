#pragma once
// Z-Image (diffusers' ZImagePipeline), as src/families/registry.cpp registers it: its
// checkpoints (checkpoint.h) and its stages (stages.h).
#include "families/zimage/checkpoint.h"
#include "families/zimage/stages.h"
