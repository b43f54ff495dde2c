#pragma once
// The model families a program runs. Each family is one folder of src/families (its
// checkpoints: weights/family.h's ModelFamily; its pipeline stages: pipeline/stages.h's
// FamilyStages; its chat template, options and defaults) and one line of the table in
// registry.cpp, which registers the built-in families when the program starts. The weights
// layer and the pipeline find a family by its id through what is registered
// (model_families(), stages_for()) and know no family by name.
#include "pipeline/stages.h"
#include "weights/family.h"

namespace klein {

// Adds a family after those registered before it (the built-in ones first: registry.cpp).
// Throws if a family of the same id is registered. `checkpoint` and `stages` must live as
// long as the program (a family's statics).
void register_family(const ModelFamily& checkpoint, const FamilyStages& stages);

// Registers the built-in families, once (later calls do nothing). registry.cpp calls it as
// the program starts; a caller that may be linked from a static archive, where nothing else
// pulls that file in (the C API), calls it too.
void register_built_in_families();

}  // namespace klein
