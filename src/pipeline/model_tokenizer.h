#pragma once
// The tokenizer of a model however it is given: the tokenizer/ directory of a diffusers
// checkpoint, --tokenizer DIR, or the files stored inside a klein container.
#include "tokenizer/tokenizer.h"
#include "weights/model_source.h"
#include "weights/weight_store.h"

namespace klein {

// `opened`: the model's weights as opened from `paths` (read_tokenizer_files: a container is
// then not parsed again for its tokenizer).
Tokenizer load_model_tokenizer(const ModelPaths& paths, const WeightStore* opened = nullptr);

}  // namespace klein
