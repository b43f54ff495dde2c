#include "pipeline/model_tokenizer.h"

#include "weights/container_store.h"

namespace klein {

Tokenizer load_model_tokenizer(const ModelPaths& paths, const WeightStore* opened) {
  return Tokenizer(read_tokenizer_files(paths, opened).files());
}

}  // namespace klein
