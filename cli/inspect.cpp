// klein inspect: what a model is made of. Parses the options, asks weights/summary.h for the
// description and prints it, as text or (--json) as one JSON document.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "core/memory.h"
#include "convert/inspect.h"
#include "formats/container/reader.h"
#include "weights/family.h"
#include "weights/summary.h"

namespace klein::cli {
namespace {

struct InspectOptions {
  ModelPaths paths;
  bool json = false;
};

// 19376579 -> "19,376,579"
std::string with_separators(uint64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Decimal units, as checkpoint sizes are usually quoted ("7.75 GB").
std::string human_bytes(uint64_t n) { return format_decimal_bytes(n, 1); }

// "1 tensor", "49 tensors"
std::string tensors(int64_t n) {
  return with_separators(uint64_t(n)) + (n == 1 ? " tensor" : " tensors");
}

std::string counts_line(const TensorCounts& c) {
  return tensors(c.tensors) + ", " + with_separators(uint64_t(c.parameters)) + " parameters, " +
         human_bytes(c.bytes);
}

// The entries of a config object as "key=value" words, wrapped under an indent.
void print_config(const nlohmann::json& config, const std::string& indent) {
  std::string line;
  for (const auto& [key, value] : config.items()) {
    const std::string word =
        key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
    if (!line.empty() && line.size() + 1 + word.size() > 88) {
      std::printf("%s%s\n", indent.c_str(), line.c_str());
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) std::printf("%s%s\n", indent.c_str(), line.c_str());
}

void print_component(const ComponentSummary& c, const nlohmann::json& config) {
  std::printf("\n%s: %s layout\n", component_name(c.component), layout_name(c.layout));
  if (!c.index_file.empty())
    std::printf("  index:  %s (%zu shards)\n", c.index_file.c_str(), c.files.size());
  for (const auto& f : c.files) std::printf("  file:   %s\n", f.c_str());
  if (c.config_file.empty())
    std::printf("  config: read from the tensor shapes\n");
  else
    std::printf("  config: %s (checked against the tensor shapes)\n", c.config_file.c_str());
  print_config(config, "          ");
  std::printf("  %s\n", counts_line(c.counts).c_str());
  for (const auto& [dtype, counts] : c.dtypes)
    std::printf("  %-6s  %s, %s\n", dtype.c_str(), tensors(counts.tensors).c_str(),
                human_bytes(counts.bytes).c_str());
  std::printf("  units:\n");
  for (const auto& u : c.units)
    std::printf("    %-28s %12s %15s parameters %10s%s\n", u.name.c_str(),
                tensors(u.counts.tensors).c_str(),
                with_separators(uint64_t(u.counts.parameters)).c_str(),
                human_bytes(u.counts.bytes).c_str(),
                u.read_by_inference ? "" : "  (not read by inference)");
  if (!c.unused.empty()) {
    std::printf("  not read by inference:");
    for (const auto& name : c.unused) std::printf(" %s", name.c_str());
    std::printf("\n");
  }
}

void print_text(const ModelSummary& s) {
  const nlohmann::json config = to_json(s.config);
  std::printf("model: %s", s.name.c_str());
  if (!s.model.empty()) std::printf(" (%s)", s.model.c_str());
  const std::string variant = variant_name(s.config);
  if (!s.config.undecided_variant.empty())
    std::printf("\n  variant: undecided (%s)", s.config.undecided_variant.c_str());
  else if (!variant.empty())
    std::printf("\n  variant: %s (docs/MODELS.md)", variant.c_str());
  const ModelFamily& family = model_family(s.config);
  std::printf("\n  family: %s (%s)\n", std::string(family.title()).c_str(),
              family.describe_transformer(s.config).c_str());
  for (const std::string& line : family.describe_pipeline(s.config))
    std::printf("  %s\n", line.c_str());
  std::printf("  scheduler:\n");
  print_config(config.at("scheduler"), "    ");
  for (const auto& c : s.components) print_component(c, config.at(component_key(c.component)));
  if (!s.tokenizer)
    std::printf("\ntokenizer: none (%s)\n", s.tokenizer_problem.c_str());
  else if (s.tokenizer->kind == TokenizerSource::Kind::Gguf)
    std::printf("\ntokenizer: %s (in its GGUF metadata)\n", s.tokenizer->path.c_str());
  else if (s.tokenizer->kind == TokenizerSource::Kind::Tekken)
    std::printf("\ntokenizer: %s (Mistral's tekken.json in its tensor tekken_model)\n",
                s.tokenizer->path.c_str());
  else
    std::printf("\ntokenizer: %s\n", s.tokenizer->path.c_str());
  std::printf("\ntotal: %s\n", counts_line(s.total).c_str());
}

void run_inspect(const InspectOptions& o) {
  // A klein container (a file whose first bytes are the container magic) gets its own
  // description: its units, storage types, sizes, checksums and conversion record.
  // Everything else is an original checkpoint, described from its safetensors headers.
  if (!o.paths.model.empty() && container::is_container(o.paths.model)) {
    const nlohmann::json d = convert::describe_container(o.paths.model);
    const std::string text = o.json ? d.dump(2) + "\n" : convert::describe_container_text(d);
    std::fputs(text.c_str(), stdout);
    return;
  }
  const ModelSummary s = describe_model(o.paths);
  if (o.json)
    std::printf("%s\n", to_json(s).dump(2).c_str());
  else
    print_text(s);
}

}  // namespace

static Registration inspect_command("inspect", 20, [](CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Describe a model: files, layout, configuration, tensor and parameter counts");
  add_model_options(*cmd, options->paths);
  cmd->add_option("file", options->paths.model, "a klein container or model directory (same as -m)");
  cmd->add_flag("--json", options->json, "print the description as one JSON document");
  cmd->callback([options] { run_inspect(*options); });
});

}  // namespace klein::cli
