// klein tokenize: the token ids of a text, or with --template the padded ids and the
// attention mask the text encoder receives for a prompt, as the model's family builds them
// (FamilyStages::prompt_tokens). Parses the options and prints; the tokenizer and the
// family's stages do the work.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "formats/container/reader.h"
#include "pipeline/model_tokenizer.h"
#include "pipeline/stages.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "weights/gguf_source.h"
#include "weights/model_source.h"

namespace klein::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeOptions {
  fs::path model;
  std::string text;
  bool use_template = false;
  bool json = false;
};

// MODEL as one of the model options would name it: a klein container or a diffusers
// directory as -m, a llama.cpp GGUF text encoder or a Mistral file carrying tekken.json as
// --text-encoder, a directory of tokenizer files as --tokenizer. tokenizer_source then reads
// the tokenizer from where every other command would.
ModelPaths paths_of(const fs::path& model) {
  check(fs::exists(model), model.string(), " does not exist");
  ModelPaths paths;
  if (is_gguf(model) || (fs::is_regular_file(model) && !container::is_container(model) &&
                         model.extension() == ".safetensors")) {
    paths.text_encoder = model;
  } else if (container::is_container(model) || holds_tokenizer(model / "tokenizer")) {
    paths.model = model;
  } else {
    check(holds_tokenizer(model), model.string(),
          ": no tokenizer found (expected a klein container, a llama.cpp GGUF text encoder, a "
          "Mistral text encoder file carrying tekken.json, or vocab.json, tokenizer.json or "
          "tekken.json in ", (model / "tokenizer").string(), " or in the directory itself)");
    paths.tokenizer = model;
  }
  return paths;
}

// The family whose text conditioning --template shows: the model's, when MODEL is one (a
// container or a diffusers directory, opened as generate opens it); a tokenizer or a text
// encoder alone has no family and gets the default configuration's.
const FamilyStages& family_of(const ModelPaths& paths) {
  if (paths.model.empty()) return stages_for(ModelConfig{});
  return stages_for(open_model(paths)->config());
}

void print_ids(const std::vector<int32_t>& ids) {
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) line += ' ';
    line += std::to_string(ids[i]);
  }
  std::printf("%s\n", line.c_str());
}

void print_raw(const Tokenizer& tokenizer, const TokenizeOptions& o) {
  const std::vector<int32_t> ids = tokenizer.encode(o.text);
  if (!o.json) {
    print_ids(ids);
    return;
  }
  nlohmann::json out;
  out["ids"] = ids;
  std::vector<std::string> tokens;
  for (int32_t id : ids) tokens.push_back(tokenizer.token(id));
  out["tokens"] = tokens;
  out["decoded"] = tokenizer.decode(ids);
  std::printf("%s\n", out.dump().c_str());
}

void print_template(const Tokenizer& tokenizer, const FamilyStages& family,
                    const TokenizeOptions& o) {
  const PromptTokens p = family.prompt_tokens(tokenizer, o.text);
  if (!p.warning.empty()) std::fprintf(stderr, "warning: %s\n", p.warning.c_str());
  if (!o.json) {
    print_ids(p.ids);
    print_ids(p.mask);
    return;
  }
  nlohmann::json out;
  out["chat_text"] = family.prompt_chat_text(o.text);
  out["ids"] = p.ids;
  out["attention_mask"] = p.mask;
  out["real_tokens"] = p.real_tokens;
  out["dropped"] = p.dropped;
  out["pad_id"] = p.pad_id;
  if (!p.warning.empty()) out["warning"] = p.warning;
  std::printf("%s\n", out.dump().c_str());
}

void run_tokenize(const TokenizeOptions& o) {
  const ModelPaths paths = paths_of(o.model);
  const Tokenizer tokenizer = load_model_tokenizer(paths);
  if (o.use_template) {
    print_template(tokenizer, family_of(paths), o);
  } else {
    print_raw(tokenizer, o);
  }
}

}  // namespace

static Registration tokenize_command("tokenize", 30, [](CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Print the token ids of a text, or the text encoder's input for a prompt");
  cmd->add_option("-m,--model", options->model,
                  "a klein container (the tokenizer stored in it), a diffusers directory (its "
                  "tokenizer/), a llama.cpp GGUF text encoder (the tokenizer in its metadata), a "
                  "Mistral .safetensors text encoder carrying tekken.json (ComfyUI's), or a "
                  "directory holding the tokenizer files (vocab.json + merges.txt, "
                  "tokenizer.json, or Mistral's tekken.json)")
      ->required();
  cmd->add_flag("--template", options->use_template,
                "wrap TEXT in the chat template of the model's pipeline as generate does and "
                "print the padded ids, then the attention mask (a tokenizer or text encoder "
                "alone: FLUX.2-klein's template)");
  cmd->add_flag("--json", options->json, "print JSON (ids, tokens, decoded text / mask, counts)");
  // The text as the other subcommands take a prompt (-p), or as the last argument.
  CLI::Option* prompt = cmd->add_option("-p,--prompt", options->text, "the text or prompt");
  CLI::Option* text = cmd->add_option("text", options->text, "the text or prompt (as -p)");
  prompt->excludes(text);
  text->excludes(prompt);
  cmd->callback([options, prompt, text] {
    check(prompt->count() + text->count() == 1, "tokenize: give the text (TEXT or -p TEXT)");
    run_tokenize(*options);
  });
});

}  // namespace klein::cli
