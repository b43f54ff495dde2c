#include "convert/report/report.h"

#include <unistd.h>

#include "convert/convert.h"
#include "core/error.h"
#include "formats/container/reader.h"
#include "pipeline/model_tokenizer.h"
#include "weights/container_store.h"
#include "weights/family.h"
#include "weights/source_store.h"

namespace klein::report {

namespace fs = std::filesystem;

namespace {

void check_options(const ReportOptions& o) {
  check(!o.candidate.empty(), "give the candidate container with --candidate FILE");
  check(fs::exists(o.candidate), "--candidate ", o.candidate.string(), ": no such file");
  check(fs::is_regular_file(o.candidate) && container::is_container(o.candidate), "--candidate ",
        o.candidate.string(), ": not a klein container (make one with klein convert)");
  const ModelPaths& r = o.reference;
  check(!r.model.empty() || !r.diffusion_model.empty() || !r.text_encoder.empty() ||
            !r.vae.empty(),
        "give the reference with -m (the source checkpoint or a BF16/F32 container)");
  if (o.goal) {
    check(o.e2e, "a policy search calibrates on the end-to-end run: drop --no-e2e");
    check(o.blocks == BlockProbes::Isolated || o.blocks == BlockProbes::Both,
          "a policy search needs the isolated block probes: --blocks isolated or both");
  }
}

ModelInfo info(const WeightStore& store, const fs::path& path) {
  ModelInfo m;
  m.path = path.string();
  m.name = store.config().name;
  m.identity = store.identity();
  if (fs::is_regular_file(path)) m.file_bytes = fs::file_size(path);
  return m;
}

fs::path reference_path(const ModelPaths& p) {
  return !p.model.empty() ? p.model : !p.diffusion_model.empty() ? p.diffusion_model
                                                                    : p.text_encoder;
}

SizeModel size_model(const fs::path& candidate) {
  const container::ContainerFile file(candidate);
  SizeModel m;
  m.file_bytes = fs::file_size(candidate);
  m.alignment = file.header().alignment;
  for (const auto& u : file.index().units) m.unit_bytes[u.name] = u.size;
  return m;
}

// Removes a file when it goes out of scope (the converted proposals are only measured).
class TemporaryFile {
 public:
  explicit TemporaryFile(fs::path path) : path_(std::move(path)) {}
  ~TemporaryFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Verifying a proposal: convert the reference with it, as `klein convert --policy` would,
// into a temporary container, and run the same comparison on it.
MeasureFn verifier(const ReportOptions& o, uint64_t alignment, E2eSession& session,
                   Progress& progress) {
  return [&o, alignment, &session, &progress](const std::string& policy) {
    TemporaryFile file(fs::temp_directory_path() /
                       ("klein-report-" + std::to_string(::getpid()) + "-proposal.klein"));
    convert::ConvertOptions c;
    c.source = o.reference;
    c.output = file.path();
    c.target = DType::Q4;
    c.policy_text = policy;
    c.policy_origin = "proposed policy";
    c.alignment = alignment;
    c.threads = o.threads;
    {
      Phase phase(progress, "proposal: convert");
      c.progress = [&](const convert::ConvertProgress& p) {
        phase.step(int(p.unit), int(p.units));
      };
      convert::convert_model(c);
    }
    ContainerStore store(file.path());
    Measurement m;
    m.file_bytes = fs::file_size(file.path());
    m.e2e = session.compare(store, progress);
    return m;
  };
}

}  // namespace

Report build_report(const ReportOptions& o, Progress& progress) {
  check_options(o);
  std::unique_ptr<WeightStore> reference = open_model(o.reference);
  // A quantized GGUF reference is measured as the values its blocks stand for.
  if (auto* source = dynamic_cast<SourceStore*>(reference.get())) source->set_decode_blocks(true);
  ModelPaths candidate_paths;
  candidate_paths.model = o.candidate;
  std::unique_ptr<WeightStore> candidate = open_model(candidate_paths);
  // Both are one model: of one family (the generations and probes run its stages).
  const ModelConfig& reference_config = reference->config();
  const ModelConfig& candidate_config = candidate->config();
  check(reference_config.family == candidate_config.family, "--candidate ",
        o.candidate.string(), " is a ", model_family(candidate_config).title(), " model and the "
        "reference ", reference_path(o.reference).string(), " a ",
        model_family(reference_config).title(), " model: compare a container with the "
        "model it was converted from");
  check(o.e2e || !o.tiny.on(), "the tiny decoder is measured end to end: not with --no-e2e");
  check_tiny_decoder(o.tiny, reference_config);
  Compute cx(o.threads);

  Report r;
  r.reference = info(*reference, reference_path(o.reference));
  r.candidate = info(*candidate, o.candidate);
  {
    Phase phase(progress, "compare tensors", int(candidate->units().size()));
    CompareOptions c;
    c.alternatives = o.goal.has_value();
    c.progress = [&](size_t done, size_t total, const std::string&) {
      phase.step(int(done), int(total));
    };
    r.weights = compare_weights(*reference, *candidate, cx, c);
  }
  if (o.e2e) {
    const Tokenizer tokenizer = load_model_tokenizer(o.reference, reference.get());
    E2eOptions e;
    e.cases = make_cases(reference->config(), o.prompts, o.seeds, o.width, o.height, o.steps);
    e.blocks = o.blocks;
    e.probe_step = o.probe_step;
    e.precision = o.precision;
    e.tiny = o.tiny;
    r.blocks = o.blocks;
    E2eSession session(*reference, tokenizer, cx, e, progress);
    r.e2e = session.compare(*candidate, progress);
    if (o.goal) {
      const SizeModel size = size_model(o.candidate);
      r.policy = search_policy(r.weights, *r.e2e, *o.goal, size, o.verify_rounds,
                               verifier(o, size.alignment, session, progress));
    }
  }
  return r;
}

}  // namespace klein::report
