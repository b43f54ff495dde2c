// The families built into the engine, one line each. The order is the order in which a
// transformer file without a model_index.json is recognised, and the first family is the one
// such a file falls back to (weights/model_source.cpp): FLUX.2-klein's names are the default.
#include "families/registry.h"

#include "families/flux2_dev/family.h"
#include "families/flux2_klein/family.h"
#include "families/zimage/family.h"

namespace klein {

void register_family(const ModelFamily& checkpoint, const FamilyStages& stages) {
  register_model_family(checkpoint);
  register_stages(checkpoint.id(), stages);
}

void register_built_in_families() {
  static const bool registered = [] {
    register_family(flux2_klein::checkpoint(), flux2_klein::stages());
    register_family(zimage::checkpoint(), zimage::stages());
    register_family(flux2_dev::checkpoint(), flux2_dev::stages());
    return true;
  }();
  (void)registered;
}

namespace {

// As the program starts (or the shared library loads).
[[maybe_unused]] const bool kRegisteredAtStart = (register_built_in_families(), true);

}  // namespace

}  // namespace klein
