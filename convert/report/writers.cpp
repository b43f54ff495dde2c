#include "convert/report/writers.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <regex>
#include <sstream>

#include "convert/policy.h"
#include "convert/report/number_text.h"
#include "core/error.h"
#include "core/files.h"
#include "formats/image/codecs.h"
#include "quant/matmul.h"

namespace klein::report {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// --- numbers ----------------------------------------------------------------------------------

ojson number(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

// v printed with a printf conversion taking a precision ("%.*f", "%.*e", "%.*g"); nan and
// infinities spelled out the same way for every format.
std::string formatted(double v, const char* format, int digits) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, digits, v);
  return buf;
}

std::string fixed(double v, int digits) { return formatted(v, "%.*f", digits); }

// Full precision for CSV (scripts read it back).
std::string exact(double v) { return formatted(v, "%.*g", 9); }

std::string shape_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += 'x';
    out += std::to_string(s[i]);
  }
  return out.empty() ? "scalar" : out;
}

std::string megabytes(uint64_t b) { return fixed(double(b) / 1e6, 2) + " MB"; }

// --- JSON -------------------------------------------------------------------------------------

ojson error_json(const ErrorSummary& e) {
  return {{"rmse", number(e.rmse)},   {"nmse", number(e.nmse)},
          {"snr_db", number(e.snr_db)}, {"cosine", number(e.cosine)},
          {"max_abs_error", number(e.max_abs)}};
}

ojson group_json(const GroupTotals& g) {
  ojson j = {{"name", g.name},
             {"tensors", g.tensors},
             {"parameters", g.parameters},
             {"bytes", g.bytes},
             {"reference_bytes", g.reference_bytes},
             {"bits_per_weight", number(g.bits_per_weight())}};
  j.update(error_json(summarize(g.stats)));
  j["worst_tensor"] = g.worst_tensor;
  j["worst_nmse"] = number(g.worst_nmse);
  return j;
}

ojson tensor_json(const TensorError& t) {
  ojson j = {{"name", t.name},
             {"unit", t.unit},
             {"component", t.component},
             {"shape", t.shape},
             {"reference_type", type_name(t.reference_type)},
             {"type", type_name(t.type)},
             {"layout", std::string(quant::layout_name(quant::Layout(t.layout)))},
             {"parameters", t.numel()},
             {"bytes", t.bytes},
             {"bits_per_weight", number(t.bits_per_weight())}};
  j.update(error_json(t.error));
  if (!t.alternatives.empty()) {
    ojson alts = ojson::object();
    for (const auto& a : t.alternatives)
      alts[type_name(a.type)] = {{"nmse", number(a.nmse)}, {"bytes", a.bytes}};
    j["alternatives"] = alts;
  }
  return j;
}

ojson histogram_json(const ErrorHistogram& h) {
  ojson bins = ojson::array();
  for (int i = 0; i < ErrorHistogram::kBins; ++i)
    bins.push_back({{"from", ErrorHistogram::bin_lower(i)},
                    {"to", ErrorHistogram::bin_lower(i + 1)},
                    {"count", h.bins()[size_t(i)]}});
  return {{"measure", "|candidate - reference| / rms(reference row), every value of every tensor"},
          {"exact", h.exact()},
          {"below", h.below()},
          {"above", h.above()},
          {"bins", bins}};
}

ojson case_json(const CaseResult& c, size_t index) {
  ojson steps = ojson::array();
  for (size_t i = 0; i < c.step_latents.size(); ++i) {
    ojson s = error_json(c.step_latents[i]);
    s["step"] = i;
    steps.push_back(s);
  }
  ojson layers = ojson::array();
  for (size_t i = 0; i < c.text_layers.size(); ++i) {
    ojson l = error_json(c.text_layers[i]);
    l["layer"] = i + 1;
    layers.push_back(l);
  }
  const std::string stem = "case" + std::to_string(index + 1);
  return {{"prompt", c.spec.prompt},
          {"seed", c.spec.seed},
          {"width", c.spec.width},
          {"height", c.spec.height},
          {"steps", c.spec.steps},
          {"context", error_json(c.context)},
          {"text_layers", layers},
          {"step_latents", steps},
          {"final_latents", error_json(c.final_latents)},
          {"image",
           {{"psnr_db", number(c.psnr_db)},
            {"ssim", number(c.ssim)},
            {"pixels", error_json(c.image)},
            {"difference_gain", c.difference_gain},
            {"files",
             {{"reference", stem + "-reference.png"},
              {"candidate", stem + "-candidate.png"},
              {"difference", stem + "-difference.png"}}}}},
          {"tiny_decoder",
           c.tiny ? ojson{{"file", c.tiny->file},
                          {"psnr_db", number(c.tiny->psnr_db)},
                          {"ssim", number(c.tiny->ssim)},
                          {"pixels", error_json(c.tiny->image)},
                          {"image", stem + "-tiny.png"}}
                  : ojson()}};
}

ojson probe_json(const BlockProbe& p, BlockProbes mode) {
  ojson blocks = ojson::array();
  for (const auto& b : p.blocks) {
    ojson j = {{"name", b.name}, {"unit", b.unit}};
    j["accumulated"] = b.accumulated ? error_json(*b.accumulated) : ojson(nullptr);
    j["isolated"] = b.isolated ? error_json(*b.isolated) : ojson(nullptr);
    blocks.push_back(j);
  }
  ojson sens = ojson::array();
  for (const auto& s : p.sensitivities)
    sens.push_back({{"group", s.group}, {"velocity_nmse", number(s.velocity_nmse)}});
  return {{"case", 1},
          {"step", p.step},
          {"timestep", p.timestep},
          {"method", block_probes_name(mode)},
          {"method_note",
           "accumulated: the whole candidate transformer against the whole reference on the "
           "reference's latents and context at this step, so each block's error includes "
           "what earlier blocks passed on; isolated: one forward per unit with only that unit "
           "from the candidate, so each block sees exactly the reference's activations"},
          {"blocks", blocks},
          {"velocity", p.velocity ? error_json(*p.velocity) : ojson(nullptr)},
          {"isolated_velocity", sens},
          {"isolated_velocity_nmse_sum", number(p.isolated_velocity_nmse_sum)},
          {"vae_image_mse", number(p.vae_image_mse)}};
}

ojson policy_json(const PolicyProposal& p) {
  ojson tensors = ojson::array();
  for (const auto& t : p.tensors)
    tensors.push_back({{"name", t.name},
                       {"group", t.group},
                       {"type", type_name(t.type)},
                       {"candidate_type", type_name(t.candidate)},
                       {"minimum", type_name(t.minimum)},
                       {"nmse", number(t.nmse)},
                       {"bytes", t.bytes},
                       {"sensitivity", number(t.sensitivity)}});
  ojson goal = ojson::object();
  if (p.goal.min_psnr_db) goal["min_psnr_db"] = *p.goal.min_psnr_db;
  if (p.goal.max_bytes) goal["max_bytes"] = *p.goal.max_bytes;
  ojson rounds = ojson::array();
  for (const auto& r : p.rounds) {
    ojson j = {{"predicted_file_bytes", r.predicted_file_bytes},
               {"predicted_psnr_db", number(r.predicted_psnr_db)}};
    j["measured_file_bytes"] = r.measured_file_bytes ? ojson(*r.measured_file_bytes) : ojson();
    j["measured_psnr_db"] = r.measured_psnr_db ? number(*r.measured_psnr_db) : ojson();
    j["types"] = r.types;
    rounds.push_back(j);
  }
  ojson j = {{"goal", goal},
             {"met", p.met},
             {"verified", p.verified},
             {"predicted_file_bytes", p.predicted_file_bytes},
             {"predicted_tensor_bytes", p.predicted_tensor_bytes},
             {"predicted_image_mse", number(p.predicted_image_mse)},
             {"predicted_psnr_db", number(p.predicted_psnr_db)}};
  j["measured_file_bytes"] = p.measured_file_bytes ? ojson(*p.measured_file_bytes) : ojson();
  j["measured_psnr_db"] = p.measured_psnr_db ? number(*p.measured_psnr_db) : ojson();
  j.update(ojson{{"candidate_file_bytes", p.candidate_file_bytes},
                 {"candidate_image_mse", number(p.candidate_image_mse)},
                 {"candidate_psnr_db", number(p.candidate_psnr_db)},
                 {"calibration", number(p.calibration)},
                 {"rounds", rounds},
                 {"tensors", tensors},
                 {"policy", p.text}});
  return j;
}

ojson model_json(const ModelInfo& m) {
  ojson j = {{"path", m.path}, {"name", m.name}, {"identity", m.identity}};
  if (m.file_bytes) j["file_bytes"] = m.file_bytes;
  return j;
}

// --- text tables --------------------------------------------------------------------------------

// Columns padded to their widest cell; the first column left-aligned, the rest right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> header) { rows_.push_back(std::move(header)); }
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string str(const std::string& indent = "  ") const {
    std::vector<size_t> width;
    for (const auto& r : rows_)
      for (size_t i = 0; i < r.size(); ++i) {
        if (width.size() <= i) width.push_back(0);
        width[i] = std::max(width[i], r[i].size());
      }
    std::string out;
    for (const auto& r : rows_) {
      std::string line = indent;
      for (size_t i = 0; i < r.size(); ++i) {
        const std::string pad(width[i] - r[i].size(), ' ');
        line += i == 0 ? r[i] + pad : "  " + pad + r[i];
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out += line + "\n";
    }
    return out;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::vector<std::string> group_row(const GroupTotals& g) {
  const ErrorSummary e = summarize(g.stats);
  return {g.name, std::to_string(g.tensors), std::to_string(g.parameters), megabytes(g.bytes),
          fixed(g.bits_per_weight(), 2), sci(e.nmse), fixed(e.snr_db, 1), fixed(e.cosine, 6)};
}

std::string types_summary(const WeightComparison& w) {
  std::map<std::string, size_t> counts;
  for (const auto& t : w.tensors) ++counts[type_name(t.type)];
  std::string out;
  for (const auto& [type, n] : counts) {
    if (!out.empty()) out += ", ";
    out += type + " " + std::to_string(n);
  }
  return out;
}

void weights_table(const Report& r, size_t worst, std::ostringstream& s) {
  const WeightComparison& w = r.weights;
  s << "Tensors: " << w.tensors.size() << " compared (" << types_summary(w) << "), "
    << fixed(w.total.bits_per_weight(), 2) << " bits/weight, " << megabytes(w.total.bytes)
    << " (reference " << megabytes(w.total.reference_bytes) << ")";
  if (!w.reference_only.empty())
    s << "; " << w.reference_only.size() << " reference units/tensors the candidate drops";
  s << "\n\n";
  const std::vector<std::string> header = {"", "tensors", "parameters", "size", "bits/w",
                                           "NMSE", "SNR dB", "cosine"};
  Table components(header);
  components.add(group_row(w.total));
  for (const auto& g : w.components) components.add(group_row(g));
  s << "Per component\n" << components.str() << "\n";
  Table units(header);
  for (const auto& g : w.units) units.add(group_row(g));
  s << "Per unit\n" << units.str() << "\n";
  Table tensors({"worst tensors", "type", "bits/w", "RMSE", "NMSE", "SNR dB", "cosine", "max|err|"});
  for (size_t i = 0; i < std::min(worst, w.tensors.size()); ++i) {
    const TensorError& t = w.tensors[i];
    tensors.add({t.name, type_name(t.type), fixed(t.bits_per_weight(), 2), sci(t.error.rmse),
                 sci(t.error.nmse), fixed(t.error.snr_db, 1), fixed(t.error.cosine, 6),
                 sci(t.error.max_abs)});
  }
  s << tensors.str();
}

void e2e_table(const E2eResult& e, BlockProbes mode, std::ostringstream& s) {
  s << "\nEnd to end (the same generation with each model; pixel values in [0, 1]; precision: "
    << "reference " << precision_name(e.reference_fast) << ", candidate "
    << precision_name(e.candidate_fast) << ", as klein generate runs them)\n";
  Table cases({"case", "seed", "size", "steps", "context cos", "context NMSE", "latents cos",
               "latents NMSE", "PSNR dB", "SSIM"});
  for (size_t i = 0; i < e.cases.size(); ++i) {
    const CaseResult& c = e.cases[i];
    cases.add({std::to_string(i + 1), std::to_string(c.spec.seed),
               std::to_string(c.spec.width) + "x" + std::to_string(c.spec.height),
               std::to_string(c.spec.steps), fixed(c.context.cosine, 6), sci(c.context.nmse),
               fixed(c.final_latents.cosine, 6), sci(c.final_latents.nmse), fixed(c.psnr_db, 2),
               fixed(c.ssim, 4)});
  }
  s << cases.str();
  for (size_t i = 0; i < e.cases.size(); ++i)
    s << "  case " << i + 1 << ": \"" << e.cases[i].spec.prompt << "\"\n";
  if (!e.cases.empty() && e.cases[0].tiny) {
    s << "\nTiny decoder " << e.cases[0].tiny->file
      << " on the reference's final latents, against the full decoder's image of them:\n";
    for (size_t i = 0; i < e.cases.size(); ++i)
      s << "  case " << i + 1 << ": PSNR " << fixed(e.cases[i].tiny->psnr_db, 2) << " dB, SSIM "
        << fixed(e.cases[i].tiny->ssim, 4) << "\n";
  }
  if (!e.probe) return;
  const BlockProbe& p = *e.probe;
  s << "\nBlocks at step " << p.step << " of case 1 (" << block_probes_name(mode)
    << "; accumulated: whole candidate, errors carried from earlier blocks; isolated: only "
       "this block from the candidate, on the reference's activations)\n";
  Table blocks({"block", "accum. cos", "accum. NMSE", "isolated cos", "isolated NMSE"});
  for (const auto& b : p.blocks) {
    auto cos = [](const std::optional<ErrorSummary>& x) { return x ? fixed(x->cosine, 6) : "-"; };
    auto nmse = [](const std::optional<ErrorSummary>& x) { return x ? sci(x->nmse) : "-"; };
    blocks.add({b.name, cos(b.accumulated), nmse(b.accumulated), cos(b.isolated),
                nmse(b.isolated)});
  }
  s << blocks.str();
  if (p.velocity)
    s << "  velocity (whole candidate transformer): cosine " << fixed(p.velocity->cosine, 6)
      << ", NMSE " << sci(p.velocity->nmse) << "\n";
  if (!p.sensitivities.empty())
    s << "  velocity NMSE, sum of the isolated units: " << sci(p.isolated_velocity_nmse_sum)
      << "; text encoder alone: " << sci(p.sensitivities.back().velocity_nmse) << "\n";
  s << "  candidate VAE alone, image MSE: " << sci(p.vae_image_mse) << "\n";
}

void policy_table(const PolicyProposal& p, std::ostringstream& s) {
  std::map<std::string, size_t> counts;
  for (const auto& t : p.tensors) ++counts[type_name(t.type)];
  s << "\nPolicy proposal: goal " << (p.met ? "met" : "NOT met")
    << (p.verified ? " (measured)" : " (predicted)") << "; tensors listed:";
  for (const auto& [type, n] : counts) s << " " << type << " " << n;
  s << "\n";
  Table rounds({"round", "predicted size", "predicted PSNR", "measured size", "measured PSNR"});
  rounds.add({"candidate", "", "", megabytes(p.candidate_file_bytes),
              fixed(p.candidate_psnr_db, 2) + " dB"});
  for (size_t i = 0; i < p.rounds.size(); ++i) {
    const PolicyRound& r = p.rounds[i];
    rounds.add({std::to_string(i + 1), megabytes(r.predicted_file_bytes),
                fixed(r.predicted_psnr_db, 2) + " dB",
                r.measured_file_bytes ? megabytes(*r.measured_file_bytes) : "-",
                r.measured_psnr_db ? fixed(*r.measured_psnr_db, 2) + " dB" : "-"});
  }
  s << rounds.str();
}

// --- CSV --------------------------------------------------------------------------------------

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_line(const std::vector<std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < fields.size(); ++i) {
    if (i) out += ',';
    out += csv_field(fields[i]);
  }
  return out + "\n";
}

std::vector<std::string> error_fields(const ErrorSummary& e) {
  return {exact(e.cosine), exact(e.nmse), exact(e.snr_db), exact(e.rmse), exact(e.max_abs)};
}

// --- files --------------------------------------------------------------------------------------

}  // namespace

ojson report_json(const Report& r) {
  ojson j;
  j["format"] = "klein-report";
  j["version"] = 1;
  j["reference"] = model_json(r.reference);
  j["candidate"] = model_json(r.candidate);
  j["infinite_values"] = "null: identical data (SNR and PSNR of equal values)";
  j["totals"] = group_json(r.weights.total);
  for (const auto& g : r.weights.components) j["components"].push_back(group_json(g));
  for (const auto& g : r.weights.units) j["units"].push_back(group_json(g));
  j["tensors"] = ojson::array();
  for (const auto& t : r.weights.tensors) j["tensors"].push_back(tensor_json(t));
  j["histogram"] = histogram_json(r.weights.histogram);
  j["reference_only"] = r.weights.reference_only;
  if (r.e2e) {
    ojson cases = ojson::array();
    for (size_t i = 0; i < r.e2e->cases.size(); ++i) cases.push_back(case_json(r.e2e->cases[i], i));
    j["e2e"] = {{"precision", {{"reference", precision_name(r.e2e->reference_fast)},
                               {"candidate", precision_name(r.e2e->candidate_fast)}}},
                {"cases", cases},
                {"mean_image_mse", number(r.e2e->mean_image_mse)}};
    j["e2e"]["blocks"] = r.e2e->probe ? probe_json(*r.e2e->probe, r.blocks) : ojson(nullptr);
  }
  if (r.policy) j["policy"] = policy_json(*r.policy);
  return j;
}

std::string report_table(const Report& r, size_t worst) {
  std::ostringstream s;
  s << "klein report: " << r.candidate.path << " against " << r.reference.path << "\n\n";
  weights_table(r, worst, s);
  if (r.e2e) e2e_table(*r.e2e, r.blocks, s);
  if (r.policy) policy_table(*r.policy, s);
  return s.str();
}

std::string tensors_csv(const Report& r) {
  std::string out = csv_line({"name", "unit", "component", "shape", "reference_type", "type",
                              "parameters", "bytes", "bits_per_weight", "cosine", "nmse",
                              "snr_db", "rmse", "max_abs_error"});
  for (const auto& t : r.weights.tensors) {
    std::vector<std::string> f = {t.name, t.unit, t.component, shape_text(t.shape),
                                  type_name(t.reference_type), type_name(t.type),
                                  std::to_string(t.numel()), std::to_string(t.bytes),
                                  exact(t.bits_per_weight())};
    for (auto& e : error_fields(t.error)) f.push_back(e);
    out += csv_line(f);
  }
  return out;
}

std::string units_csv(const Report& r) {
  std::string out = csv_line({"unit", "component", "tensors", "parameters", "bytes",
                              "reference_bytes", "bits_per_weight", "cosine", "nmse", "snr_db",
                              "rmse", "max_abs_error", "worst_tensor", "worst_nmse"});
  for (const auto& g : r.weights.units) {
    std::vector<std::string> f = {g.name, component_of(g.name), std::to_string(g.tensors),
                                  std::to_string(g.parameters), std::to_string(g.bytes),
                                  std::to_string(g.reference_bytes), exact(g.bits_per_weight())};
    for (auto& e : error_fields(summarize(g.stats))) f.push_back(e);
    f.push_back(g.worst_tensor);
    f.push_back(exact(g.worst_nmse));
    out += csv_line(f);
  }
  return out;
}

std::string e2e_csv(const Report& r) {
  if (!r.e2e) return "";
  std::string out = csv_line({"case", "seed", "stage", "name", "cosine", "nmse", "snr_db", "rmse",
                              "max_abs_error", "psnr_db", "ssim"});
  auto row = [&](size_t c, uint64_t seed, const std::string& stage, const std::string& name,
                 const ErrorSummary& e, const std::string& psnr = "", const std::string& ssim = "") {
    std::vector<std::string> f = {std::to_string(c), std::to_string(seed), stage, name};
    for (auto& x : error_fields(e)) f.push_back(x);
    f.push_back(psnr);
    f.push_back(ssim);
    out += csv_line(f);
  };
  for (size_t i = 0; i < r.e2e->cases.size(); ++i) {
    const CaseResult& c = r.e2e->cases[i];
    const uint64_t seed = c.spec.seed;
    row(i + 1, seed, "context", "context", c.context);
    for (size_t k = 0; k < c.text_layers.size(); ++k)
      row(i + 1, seed, "text_layer", "layer." + std::to_string(k + 1), c.text_layers[k]);
    for (size_t k = 0; k < c.step_latents.size(); ++k)
      row(i + 1, seed, "step_latents", "step." + std::to_string(k), c.step_latents[k]);
    row(i + 1, seed, "final_latents", "final_latents", c.final_latents);
    row(i + 1, seed, "image", "image", c.image, exact(c.psnr_db), exact(c.ssim));
  }
  if (const auto& p = r.e2e->probe) {
    const uint64_t seed = r.e2e->cases[0].spec.seed;
    for (const auto& b : p->blocks) {
      if (b.accumulated) row(1, seed, "block_accumulated", b.name, *b.accumulated);
      if (b.isolated) row(1, seed, "block_isolated", b.name, *b.isolated);
    }
    if (p->velocity) row(1, seed, "velocity_accumulated", "velocity", *p->velocity);
    // Only the NMSE of the isolated runs is kept (their sum is what the search calibrates).
    for (const auto& s : p->sensitivities)
      out += csv_line({"1", std::to_string(seed), "velocity_isolated", s.group, "",
                       exact(s.velocity_nmse), exact(-nmse_db(s.velocity_nmse)), "", "", "", ""});
  }
  return out;
}

std::vector<fs::path> write_report(const Report& r, const fs::path& dir) {
  check(!fs::exists(dir) || fs::is_directory(dir), "-o ", dir.string(),
        ": exists and is not a directory");
  // Everything is rendered before the first file is written, so that an error leaves nothing.
  std::vector<std::pair<fs::path, std::string>> files = {
      {dir / "report.json", report_json(r).dump(1) + "\n"},
      {dir / "tensors.csv", tensors_csv(r)},
      {dir / "units.csv", units_csv(r)},
      {dir / "report.html", report_html(r)},
  };
  if (r.e2e) {
    files.emplace_back(dir / "e2e.csv", e2e_csv(r));
    for (size_t i = 0; i < r.e2e->cases.size(); ++i) {
      const CaseResult& c = r.e2e->cases[i];
      const std::string stem = "case" + std::to_string(i + 1);
      files.emplace_back(dir / (stem + "-reference.png"), png_bytes(c.reference_image));
      files.emplace_back(dir / (stem + "-candidate.png"), png_bytes(c.candidate_image));
      files.emplace_back(dir / (stem + "-difference.png"), png_bytes(c.difference_image));
      if (c.tiny) files.emplace_back(dir / (stem + "-tiny.png"), png_bytes(c.tiny->tiny_image));
    }
  }
  if (r.policy) files.emplace_back(dir / "policy.txt", r.policy->text);
  std::error_code ec;
  const bool created = !fs::exists(dir);
  fs::create_directories(dir, ec);
  check(!ec, "-o ", dir.string(), ": cannot create the directory: ", ec.message());
  // Every file is written to its temporary name and put on the disk before any replaces a
  // file of an earlier report: a full disk leaves the directory as it was (or no directory),
  // never a mix of old and new files.
  std::vector<fs::path> written;
  {
    std::vector<std::unique_ptr<AtomicFile>> staged;
    try {
      for (const auto& [path, bytes] : files) {
        staged.push_back(std::make_unique<AtomicFile>(path));
        staged.back()->write(bytes);
        staged.back()->flush();
      }
    } catch (const Error&) {
      staged.clear();
      if (created) fs::remove(dir, ec);  // only if empty
      throw;
    }
    for (size_t i = 0; i < staged.size(); ++i) {
      staged[i]->commit();
      written.push_back(files[i].first);
    }
  }
  // Files an earlier report wrote there and this one does not (more cases, a policy).
  static const std::regex own(R"((case[0-9]+-(reference|candidate|difference)\.png|e2e\.csv|policy\.txt))");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, own) &&
        std::find(written.begin(), written.end(), dir / name) == written.end())
      fs::remove(entry.path(), ec);
  }
  return written;
}

}  // namespace klein::report
