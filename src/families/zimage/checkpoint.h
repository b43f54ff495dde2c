#pragma once
// Z-Image's checkpoints as the model families see them (weights/family.h): the transformer's names,
// units, shapes and configuration (models/zimage/checkpoint: units.h, config.h), its pipeline class
// (ZImagePipeline), the text-encoder layer it reads (the last but one) and its VAE (FLUX.1's
// 16-channel VAE, scaled by its factors, no latent BatchNorm).
#include "weights/family.h"

namespace klein::zimage {

const ModelFamily& checkpoint();

}  // namespace klein::zimage
