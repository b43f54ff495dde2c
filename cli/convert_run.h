#pragma once
// A conversion as `klein convert` runs it: the options checked, Ctrl-C handled (the partial
// container removed), progress and the summary on stderr. `klein pull` converts the files it
// downloaded through the same function.
#include <string>
#include <vector>

#include "cli/model_options.h"

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
};

void run_convert(const ConvertArgs& a);

}  // namespace klein::cli
