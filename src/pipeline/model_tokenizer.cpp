#include "pipeline/model_tokenizer.h"

#include "weights/container_store.h"

namespace klein {

Tokenizer load_model_tokenizer(const ModelPaths& paths) {
  const TokenizerBytes bytes = read_tokenizer_files(paths);
  auto view = [](const std::optional<std::string>& s) -> std::optional<std::string_view> {
    if (!s) return std::nullopt;
    return std::string_view(*s);
  };
  TokenizerFiles files;
  files.origin = bytes.origin;
  files.vocab_json = view(bytes.vocab_json);
  files.merges_txt = view(bytes.merges_txt);
  files.tokenizer_config_json = view(bytes.tokenizer_config_json);
  files.tokenizer_json = view(bytes.tokenizer_json);
  return Tokenizer(files);
}

}  // namespace klein
