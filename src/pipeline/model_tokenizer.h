#pragma once
// The tokenizer of a model however it is given: the tokenizer/ directory of a diffusers
// checkpoint, --tokenizer DIR, or the files stored inside a klein container.
#include "tokenizer/tokenizer.h"
#include "weights/model_source.h"

namespace klein {

Tokenizer load_model_tokenizer(const ModelPaths& paths);

}  // namespace klein
