#pragma once
// klein report: what quantization costs. A candidate container against a reference (the
// source checkpoint or a BF16/F32 container), tensor by tensor (weights.h), end to end on
// fixed prompts and seeds (e2e.h), and optionally a precision policy for a budget
// (policy_search.h). The writers turn one Report into a terminal table, JSON, CSV and a
// self-contained HTML page (writers.h).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/progress.h"
#include "convert/report/e2e.h"
#include "convert/report/policy_search.h"
#include "convert/report/weights.h"
#include "weights/model_source.h"

namespace klein::report {

struct ReportOptions {
  ModelPaths reference;
  std::filesystem::path candidate;  // a klein container
  bool e2e = true;
  // The generations compared (see make_cases: empty / zero means the built-in default).
  std::vector<std::string> prompts;
  std::vector<uint64_t> seeds;
  int64_t width = 0, height = 0, steps = 0;
  BlockProbes blocks = BlockProbes::Both;
  int64_t probe_step = 0;
  std::optional<PolicyGoal> goal;  // search for a policy
  int verify_rounds = 3;           // proposals converted and measured (0: predict only)
  int threads = 0;
  Precision precision = Precision::Auto;  // of each model's generations, as generate picks it
  TinyDecoderOptions tiny;  // with a model: the tiny decoder against the full one (e2e)
};

struct ModelInfo {
  std::string path;
  std::string name;
  std::string identity;
  uint64_t file_bytes = 0;  // a container's size; 0 for a directory
};

struct Report {
  ModelInfo reference, candidate;
  WeightComparison weights;
  std::optional<E2eResult> e2e;
  BlockProbes blocks = BlockProbes::None;
  std::optional<PolicyProposal> policy;
};

// Throws klein::Error naming the file or option for bad input, before any output is written.
Report build_report(const ReportOptions& options, Progress& progress);

}  // namespace klein::report
