// The HTML report: one self-contained page. Charts are inline SVG drawn here, images are PNG
// data URIs, styles are inline; no script, no external resource, so it opens offline in any
// browser and can be mailed as one file.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>

#include "convert/policy.h"
#include "convert/report/number_text.h"
#include "convert/report/writers.h"
#include "core/base64.h"
#include "formats/image/image.h"

namespace klein::report {

namespace {

// --- text ---------------------------------------------------------------------------------------

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v, const char* format) {
  if (std::isnan(v)) return "-";
  if (std::isinf(v)) return v > 0 ? "&#8734;" : "-&#8734;";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string fx(double v, int digits) {
  char format[16];
  std::snprintf(format, sizeof format, "%%.%df", digits);
  return num(v, format);
}

// --- charts ---------------------------------------------------------------------------------------

constexpr const char* kColors[] = {"#3b6fb6", "#d9822b", "#4f9a5b", "#9b59b6"};

struct Series {
  std::string name;
  std::vector<double> values;  // NaN: no value; -inf: no error (no bar, "exact")
};

// The axis of a chart in dB: whole multiples of 10 around the finite values.
struct Axis {
  double lo = -60, hi = 0;
  double step() const { return hi - lo > 100 ? 20 : 10; }
};

Axis db_axis(const std::vector<Series>& series) {
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& s : series)
    for (double v : s.values)
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  Axis a;
  if (!std::isfinite(lo)) return a;
  a.lo = std::floor((lo - 5) / 10) * 10;
  a.hi = std::max(a.lo + 10, std::ceil(hi / 10) * 10);
  return a;
}

// Horizontal bars, one row per label, one bar per series in each row; values in dB, the
// bars growing from the left edge (the lowest error) to the right (the highest).
std::string bar_chart(const std::string& title, const std::vector<std::string>& labels,
                      const std::vector<Series>& series, const std::string& axis_title) {
  const Axis axis = db_axis(series);
  const int label_w = 300, plot_w = 440, bar_h = 11, gap = 5, top = 34, value_w = 80;
  const int row_h = int(series.size()) * bar_h + gap;
  const int height = top + int(labels.size()) * row_h + 34;
  const int width = label_w + plot_w + value_w;
  auto x_of = [&](double v) {
    return label_w + plot_w * std::clamp((v - axis.lo) / (axis.hi - axis.lo), 0.0, 1.0);
  };
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" "
    << "font-size=\"11\">\n";
  s << "<text x=\"4\" y=\"14\" font-size=\"13\" font-weight=\"bold\">" << escape(title)
    << "</text>\n";
  for (size_t k = 0; k < series.size() && series.size() > 1; ++k)
    s << "<rect x=\"" << label_w + 150 * int(k) << "\" y=\"20\" width=\"10\" height=\"10\" fill=\""
      << kColors[k % 4] << "\"/><text x=\"" << label_w + 150 * int(k) + 14 << "\" y=\"29\">"
      << escape(series[k].name) << "</text>\n";
  const int bottom = top + int(labels.size()) * row_h;
  for (double t = axis.lo; t <= axis.hi + 1e-9; t += axis.step()) {
    const double x = x_of(t);
    s << "<line x1=\"" << x << "\" y1=\"" << top - 2 << "\" x2=\"" << x << "\" y2=\"" << bottom
      << "\" stroke=\"#ddd\"/><text x=\"" << x << "\" y=\"" << bottom + 13
      << "\" text-anchor=\"middle\">" << t << "</text>\n";
  }
  s << "<text x=\"" << label_w + plot_w / 2 << "\" y=\"" << bottom + 28
    << "\" text-anchor=\"middle\">" << escape(axis_title) << "</text>\n";
  for (size_t i = 0; i < labels.size(); ++i) {
    const int y0 = top + int(i) * row_h;
    s << "<text x=\"" << label_w - 6 << "\" y=\"" << y0 + row_h / 2 + 3
      << "\" text-anchor=\"end\">" << escape(labels[i]) << "</text>\n";
    for (size_t k = 0; k < series.size(); ++k) {
      const double v = i < series[k].values.size() ? series[k].values[i] : NAN;
      const int y = y0 + int(k) * bar_h;
      if (std::isnan(v)) continue;
      const double x1 = std::isfinite(v) ? x_of(v) : label_w;
      s << "<rect x=\"" << label_w << "\" y=\"" << y << "\" width=\"" << x1 - label_w
        << "\" height=\"" << bar_h - 2 << "\" fill=\"" << kColors[k % 4] << "\"/>"
        << "<text x=\"" << x1 + 4 << "\" y=\"" << y + bar_h - 3 << "\">"
        << (std::isfinite(v) ? fx(v, 1) : std::string("exact")) << "</text>\n";
    }
  }
  s << "</svg>\n";
  return s.str();
}

// The element-error histogram as vertical bars (share of all values per bin).
std::string histogram_chart(const ErrorHistogram& h) {
  const int left = 50, plot_w = 640, plot_h = 200, top = 30, bins = ErrorHistogram::kBins;
  const int width = left + plot_w + 20, height = top + plot_h + 50;
  const double total = double(std::max<int64_t>(1, h.total()));
  double peak = 0;
  for (int64_t c : h.bins()) peak = std::max(peak, double(c) / total);
  peak = std::max(peak, 1e-9);
  const double bar_w = double(plot_w) / bins;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << " " << height << "\" font-family=\"sans-serif\" "
    << "font-size=\"11\">\n";
  s << "<text x=\"4\" y=\"14\" font-size=\"13\" font-weight=\"bold\">Weight error histogram: "
    << "|candidate - reference| / RMS of the reference row</text>\n";
  for (int i = 0; i < bins; ++i) {
    const double share = double(h.bins()[size_t(i)]) / total;
    const double bh = plot_h * share / peak;
    s << "<rect x=\"" << left + i * bar_w << "\" y=\"" << top + plot_h - bh << "\" width=\""
      << bar_w - 1 << "\" height=\"" << bh << "\" fill=\"" << kColors[0] << "\"><title>"
      << sci(ErrorHistogram::bin_lower(i)) << " - " << sci(ErrorHistogram::bin_lower(i + 1))
      << ": " << fx(100 * share, 3) << "%</title></rect>\n";
  }
  for (int d = 0; d <= bins; d += int(ErrorHistogram::kBinsPerDecade)) {
    const double x = left + d * bar_w;
    const int exponent = int(ErrorHistogram::kMinLog10) + d / int(ErrorHistogram::kBinsPerDecade);
    s << "<line x1=\"" << x << "\" y1=\"" << top + plot_h << "\" x2=\"" << x << "\" y2=\""
      << top + plot_h + 4 << "\" stroke=\"#333\"/><text x=\"" << x << "\" y=\"" << top + plot_h + 16
      << "\" text-anchor=\"middle\">1e" << exponent << "</text>\n";
  }
  s << "<line x1=\"" << left << "\" y1=\"" << top + plot_h << "\" x2=\"" << left + plot_w
    << "\" y2=\"" << top + plot_h << "\" stroke=\"#333\"/>\n";
  s << "<text x=\"" << left - 4 << "\" y=\"" << top + 8 << "\" text-anchor=\"end\">"
    << fx(100 * peak, 1) << "%</text>\n";
  s << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 8
    << "\" text-anchor=\"middle\">relative error (log scale); exact: " << h.exact()
    << " values, below 1e-6: " << h.below() << ", 10 or more: " << h.above() << "</text>\n";
  s << "</svg>\n";
  return s.str();
}

// --- sections -----------------------------------------------------------------------------------

std::string error_cells(const ErrorSummary& e) {
  return "<td>" + fx(e.cosine, 6) + "</td><td>" + sci(e.nmse) + "</td><td>" + fx(e.snr_db, 1) +
         "</td>";
}

void summary_section(const Report& r, std::ostringstream& s) {
  const WeightComparison& w = r.weights;
  s << "<h2>Weights</h2>\n<p>" << w.tensors.size() << " tensors compared; "
    << fx(w.total.bits_per_weight(), 2) << " bits per weight; " << mb(w.total.bytes)
    << " (reference " << mb(w.total.reference_bytes) << ").</p>\n";
  s << "<table><tr><th></th><th>tensors</th><th>parameters</th><th>size</th><th>bits/w</th>"
    << "<th>cosine</th><th>NMSE</th><th>SNR dB</th><th>worst tensor</th></tr>\n";
  auto row = [&](const GroupTotals& g) {
    s << "<tr><td>" << escape(g.name) << "</td><td>" << g.tensors << "</td><td>" << g.parameters
      << "</td><td>" << mb(g.bytes) << "</td><td>" << fx(g.bits_per_weight(), 2) << "</td>"
      << error_cells(summarize(g.stats)) << "<td>" << escape(g.worst_tensor) << "</td></tr>\n";
  };
  row(w.total);
  for (const auto& g : w.components) row(g);
  s << "</table>\n";

  std::vector<std::string> labels;
  Series nmse{"NMSE", {}};
  for (const auto& g : w.units) {
    labels.push_back(g.name);
    nmse.values.push_back(nmse_db(g.stats.nmse()));
  }
  s << bar_chart("Weight error per unit", labels, {nmse}, "NMSE (dB), all values of the unit");
  s << histogram_chart(w.histogram);
}

void worst_section(const Report& r, std::ostringstream& s, size_t worst) {
  const auto& tensors = r.weights.tensors;
  const size_t n = std::min(worst, tensors.size());
  std::vector<std::string> labels;
  Series nmse{"NMSE", {}};
  for (size_t i = 0; i < n; ++i) {
    labels.push_back(tensors[i].name);
    nmse.values.push_back(nmse_db(tensors[i].error.nmse));
  }
  s << "<h2>Worst tensors</h2>\n";
  s << bar_chart("Weight error of the " + std::to_string(n) + " worst tensors", labels, {nmse},
                 "NMSE (dB)");
  s << "<table><tr><th>tensor</th><th>shape</th><th>type</th><th>bits/w</th><th>cosine</th>"
    << "<th>NMSE</th><th>SNR dB</th><th>RMSE</th><th>max |err|</th></tr>\n";
  for (size_t i = 0; i < n; ++i) {
    const TensorError& t = tensors[i];
    s << "<tr><td>" << escape(t.name) << "</td><td>" << escape(shape_str(t.shape)) << "</td><td>"
      << type_name(t.type) << "</td><td>" << fx(t.bits_per_weight(), 2) << "</td>"
      << error_cells(t.error) << "<td>" << sci(t.error.rmse) << "</td><td>"
      << sci(t.error.max_abs) << "</td></tr>\n";
  }
  s << "</table>\n<p>All " << tensors.size() << " tensors: tensors.csv and report.json.</p>\n";
}

std::string image_figure(const Image& image, const std::string& caption) {
  return "<figure><img alt=\"" + escape(caption) + "\" width=\"" +
         std::to_string(std::max(image.width, 256)) + "\" src=\"data:image/png;base64," +
         base64_encode(png_bytes(image)) + "\"/><figcaption>" + escape(caption) +
         "</figcaption></figure>\n";
}

void case_section(const CaseResult& c, size_t index, std::ostringstream& s) {
  s << "<h3>Case " << index + 1 << ": &#8220;" << escape(c.spec.prompt) << "&#8221;</h3>\n"
    << "<p>seed " << c.spec.seed << ", " << c.spec.width << "x" << c.spec.height << ", "
    << c.spec.steps << " steps: image PSNR <b>" << fx(c.psnr_db, 2) << " dB</b>, SSIM <b>"
    << fx(c.ssim, 4) << "</b>"
    << (c.tiny ? "; the tiny decoder " + escape(c.tiny->file) + " on the reference latents: PSNR <b>" +
                     fx(c.tiny->psnr_db, 2) + " dB</b>, SSIM <b>" + fx(c.tiny->ssim, 4) +
                     "</b> against the full decoder"
               : std::string())
    << "</p>\n<div class=\"images\">\n"
    << image_figure(c.reference_image, "reference")
    << image_figure(c.candidate_image, "candidate")
    << image_figure(c.difference_image,
                    "|candidate - reference| x " + fx(c.difference_gain, 0))
    << "</div>\n";
  s << "<table><tr><th>stage</th><th>cosine</th><th>NMSE</th><th>SNR dB</th></tr>\n"
    << "<tr><td>text context</td>" << error_cells(c.context) << "</tr>\n";
  for (size_t i = 0; i < c.step_latents.size(); ++i)
    s << "<tr><td>latents after step " << i << "</td>" << error_cells(c.step_latents[i])
      << "</tr>\n";
  s << "<tr><td>image pixels</td>" << error_cells(c.image) << "</tr>\n</table>\n";
  std::vector<std::string> labels;
  Series nmse{"NMSE", {}};
  for (size_t i = 0; i < c.text_layers.size(); ++i) {
    labels.push_back("text encoder layer " + std::to_string(i + 1));
    nmse.values.push_back(nmse_db(c.text_layers[i].nmse));
  }
  s << bar_chart("Text encoder: error of the stream after each layer", labels, {nmse},
                 "NMSE (dB)");
}

void probe_section(const BlockProbe& p, std::ostringstream& s) {
  s << "<h3>Transformer blocks (case 1, step " << p.step << ")</h3>\n<p><b>accumulated</b>: the "
    << "whole candidate transformer against the whole reference on the reference's latents "
    << "and context at this step; each block's error includes what earlier blocks passed on. "
    << "<b>isolated</b>: one forward per block with only that block from the candidate, so the "
    << "block sees exactly the reference's activations and the error is its own.</p>\n";
  std::vector<std::string> labels;
  Series accumulated{"accumulated", {}}, isolated{"isolated", {}};
  for (const auto& b : p.blocks) {
    labels.push_back(b.name);
    accumulated.values.push_back(b.accumulated ? nmse_db(b.accumulated->nmse) : NAN);
    isolated.values.push_back(b.isolated ? nmse_db(b.isolated->nmse) : NAN);
  }
  s << bar_chart("Block output error", labels, {accumulated, isolated}, "NMSE (dB)");
  if (!p.sensitivities.empty()) {
    std::vector<std::string> units;
    Series v{"velocity", {}};
    for (const auto& x : p.sensitivities) {
      units.push_back(x.group);
      v.values.push_back(nmse_db(x.velocity_nmse));
    }
    s << bar_chart("Velocity error with only this part from the candidate", units, {v},
                   "velocity NMSE (dB)");
  }
  s << "<p>";
  if (p.velocity)
    s << "Velocity, whole candidate transformer: cosine " << fx(p.velocity->cosine, 6)
      << ", NMSE " << sci(p.velocity->nmse) << ". ";
  if (!p.sensitivities.empty())
    s << "Sum of the isolated units' velocity NMSE: " << sci(p.isolated_velocity_nmse_sum)
      << ". ";
  s << "Candidate VAE alone on the reference latents: image MSE " << sci(p.vae_image_mse)
    << ".</p>\n";
}

void policy_section(const PolicyProposal& p, std::ostringstream& s) {
  std::map<std::string, size_t> counts;
  for (const auto& t : p.tensors) ++counts[type_name(t.type)];
  s << "<h2>Policy proposal</h2>\n<p>Goal " << (p.met ? "met" : "<b>not met</b>")
    << (p.verified ? " (measured: the proposal was converted and run)" : " (predicted)")
    << ". Tensors listed:";
  for (const auto& [type, n] : counts) s << " " << type << " " << n;
  s << ".</p>\n<table><tr><th>round</th><th>predicted size</th><th>predicted PSNR</th>"
    << "<th>measured size</th><th>measured PSNR</th></tr>\n<tr><td>candidate</td><td></td>"
    << "<td></td><td>" << mb(p.candidate_file_bytes) << "</td><td>"
    << fx(p.candidate_psnr_db, 2) << " dB</td></tr>\n";
  for (size_t i = 0; i < p.rounds.size(); ++i) {
    const PolicyRound& r = p.rounds[i];
    s << "<tr><td>" << i + 1 << "</td><td>" << mb(r.predicted_file_bytes) << "</td><td>"
      << fx(r.predicted_psnr_db, 2) << " dB</td><td>"
      << (r.measured_file_bytes ? mb(*r.measured_file_bytes) : "-") << "</td><td>"
      << (r.measured_psnr_db ? fx(*r.measured_psnr_db, 2) + " dB" : "-") << "</td></tr>\n";
  }
  s << "</table>\n<details><summary>policy.txt</summary><pre>" << escape(p.text)
    << "</pre></details>\n";
}

const char* const kStyle = R"(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1100px; }
table { border-collapse: collapse; margin: 8px 0 16px; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
svg { display: block; margin: 12px 0; }
.images { display: flex; gap: 12px; flex-wrap: wrap; }
figure { margin: 0; }
figure img { image-rendering: pixelated; border: 1px solid #ccc; }
figcaption { font-size: 12px; text-align: center; }
code, pre { font-size: 12px; }
)";

}  // namespace

std::string report_html(const Report& r) {
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n"
    << "<title>klein report: "
    << escape(std::filesystem::path(r.candidate.path).filename().string()) << "</title>\n<style>" << kStyle
    << "</style>\n</head>\n<body>\n";
  s << "<h1>Quantization report</h1>\n<p>Candidate <code>" << escape(r.candidate.path)
    << "</code> against reference <code>" << escape(r.reference.path) << "</code>.</p>\n";
  summary_section(r, s);
  worst_section(r, s, 30);
  if (r.e2e) {
    s << "<h2>End to end</h2>\n<p>The same generation (prompt, seed, size, steps) with each "
      << "model; the candidate runs entirely on its own weights. Pixel values in [0, 1]. "
      << "Precision, as <code>klein generate</code> runs each model: reference <b>"
      << precision_name(r.e2e->reference_fast) << "</b>, candidate <b>"
      << precision_name(r.e2e->candidate_fast) << "</b>.</p>\n";
    for (size_t i = 0; i < r.e2e->cases.size(); ++i) case_section(r.e2e->cases[i], i, s);
    if (r.e2e->probe) probe_section(*r.e2e->probe, s);
  }
  if (r.policy) policy_section(*r.policy, s);
  s << "</body>\n</html>\n";
  return s.str();
}

}  // namespace klein::report
