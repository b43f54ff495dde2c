#pragma once
// A conversion as `klein convert` runs it: the options checked, Ctrl-C handled (the partial
// container removed), progress and the summary on stderr. `klein pull` converts the files it
// downloaded through the same function.
#include <functional>
#include <string>
#include <vector>

#include "cli/model_options.h"

namespace klein::convert {
class SourceArrival;
struct ConvertProgress;
}

namespace klein::cli {

struct ConvertArgs {
  ModelPaths paths;
  std::string output;
  std::string type;
  std::string policy;
  bool print_policy = false;
  int alignment_kib = 64;
  int threads = 0;
  std::vector<std::string> loras;
  bool quiet = false;
  bool keep_llm = false;
  std::string safety_model;  // --safety-model DIR
  std::string controlnet;    // --controlnet PATH
  std::string tiny_vae;      // --tiny-vae FILE|DIR
  convert::SourceArrival* arrival = nullptr;  // klein pull: sources still downloading
  // Told of each unit stored, instead of the progress lines on stderr.
  std::function<void(const convert::ConvertProgress&)> on_progress;
};

void run_convert(const ConvertArgs& a);

}  // namespace klein::cli
