#include "convert/report/policy_search.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <queue>
#include <sstream>

#include "convert/policy.h"
#include "convert/report/number_text.h"
#include "convert/storage.h"
#include "core/error.h"
#include "quant/types.h"

namespace klein::report {

namespace {

constexpr DType kLadder[] = {DType::Q4, DType::Q8, DType::BF16};

int rung(DType t) {
  for (int i = 0; i < 3; ++i)
    if (kLadder[i] == t) return i;
  return -1;
}

std::string group_of(const TensorError& t) {
  return t.component == "transformer" ? t.unit : t.component;
}

const Alternative* alternative(const TensorError& t, DType type) {
  for (const auto& a : t.alternatives)
    if (a.type == type) return &a;
  return nullptr;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The type the built-in policy gives a tensor at the most aggressive target.
DType default_minimum(const TensorError& t) {
  static const convert::PrecisionPolicy defaults;
  const DType type = defaults.choose(t.name, t.shape, DType::Q4).type;
  return convert::can_store(type, t.shape) ? type : DType::BF16;
}

std::string db(double v) {
  if (std::isinf(v)) return v > 0 ? "inf dB" : "-inf dB";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f dB", v);
  return buf;
}

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// The search state: every tensor of the model at its current type.
class Search {
 public:
  Search(const WeightComparison& weights, const PolicyGoal& goal, const SizeModel& size)
      : goal_(goal), size_(size) {
    for (const auto& t : weights.tensors) {
      Entry e;
      e.tensor = &t;
      e.group = group_of(t);
      const DType minimum = default_minimum(t);
      e.chosen = quant::is_quantized(minimum);
      check(!e.chosen || alternative(t, minimum),
            "policy search: tensor ", t.name, " was measured without alternatives");
      // A fixed tensor whose default type was not measured keeps the candidate's type.
      e.minimum = e.type = e.chosen || alternative(t, minimum) ? minimum : t.type;
      entries_.push_back(e);
      unit_bytes_[t.unit] += bytes_at(e, e.type) - int64_t(t.bytes);
    }
    for (auto& [unit, delta] : unit_bytes_) {
      const auto it = size_.unit_bytes.find(unit);
      delta += it != size_.unit_bytes.end() ? int64_t(it->second) : 0;
    }
  }

  // Sensitivities from a measured model: the candidate, or the current state converted.
  void calibrate(const E2eResult& e2e, bool measured_is_candidate) {
    check(e2e.probe && !e2e.probe->sensitivities.empty(),
          "policy search: needs the isolated block probes (--blocks isolated or both)");
    const BlockProbe& probe = *e2e.probe;
    std::map<std::string, double> weight_error;  // Σ n_t at the measured types, per group
    for (const auto& e : entries_)
      weight_error[e.group] +=
          measured_is_candidate ? e.tensor->error.nmse : nmse_at(e, e.type);
    std::map<std::string, double> c;
    std::vector<double> known;
    double velocity_sum = 0;
    for (const auto& x : probe.sensitivities) {
      velocity_sum += x.velocity_nmse;
      if (weight_error[x.group] > 0) {
        c[x.group] = x.velocity_nmse / weight_error[x.group];
        known.push_back(c[x.group]);
      }
    }
    check(!known.empty(),
          "policy search: the measured model's weights equal the reference's, so there is no "
          "error to calibrate against; give a quantized candidate");
    const double fallback = median(known);
    calibration_ = velocity_sum > 0
                       ? std::max(0.0, e2e.mean_image_mse - probe.vae_image_mse) / velocity_sum
                       : 0.0;
    // A VAE whose weights are the reference's still moves the image when the candidate
    // decodes on bf16 operands (its fast arithmetic): a floor no choice of types changes.
    if (weight_error["vae"] <= 0) arithmetic_floor_ = probe.vae_image_mse;
    // Likewise a transformer or text-encoder group whose weights are the reference's but whose
    // velocity still moved: that is the candidate's arithmetic (bf16 attention on AMX CPUs),
    // which no choice of types changes either.
    for (const auto& x : probe.sensitivities)
      if (weight_error[x.group] <= 0) arithmetic_floor_ += calibration_ * x.velocity_nmse;
    for (auto& e : entries_) {
      if (e.group == "vae") {
        const double n = weight_error["vae"];
        e.sensitivity = n > 0 ? probe.vae_image_mse / n : 0.0;
        continue;
      }
      const auto it = c.find(e.group);
      e.sensitivity = calibration_ * (it != c.end() ? it->second : fallback);
    }
  }

  // Greedy upgrades from the current state until the goal is predicted to be met; returns
  // whether anything changed.
  bool upgrade() {
    std::priority_queue<Upgrade> queue;
    auto offer = [&](size_t i) {
      const Entry& e = entries_[i];
      const int from = rung(e.type);
      if (!e.chosen || from < 0 || from + 1 >= 3) return;
      const DType next = kLadder[from + 1];
      if (!alternative(*e.tensor, next)) return;
      const double gain = e.sensitivity * (nmse_at(e, e.type) - nmse_at(e, next));
      if (!(gain > 0)) return;
      const double cost = std::max(1.0, double(bytes_at(e, next) - bytes_at(e, e.type)));
      queue.push({gain / cost, i, from});
    };
    for (size_t i = 0; i < entries_.size(); ++i) offer(i);
    bool changed = false;
    double mse = predicted_mse();
    uint64_t file = predicted_file_bytes();
    while (!queue.empty()) {
      if (goal_.min_psnr_db && psnr_from_mse(mse) >= *goal_.min_psnr_db) break;
      const Upgrade u = queue.top();
      queue.pop();
      Entry& e = entries_[u.tensor];
      if (rung(e.type) != u.from) continue;
      const DType next = kLadder[u.from + 1];
      const int64_t delta = bytes_at(e, next) - bytes_at(e, e.type);
      int64_t& unit = unit_bytes_[e.tensor->unit];
      const uint64_t new_file = file - aligned(unit) + aligned(unit + delta);
      if (goal_.max_bytes && new_file > *goal_.max_bytes) continue;  // later ones only grow
      mse += e.sensitivity * (nmse_at(e, next) - nmse_at(e, e.type));
      unit += delta;
      file = new_file;
      e.type = next;
      changed = true;
      offer(u.tensor);
    }
    return changed;
  }

  double predicted_mse() const {
    double mse = arithmetic_floor_;
    for (const auto& e : entries_) mse += e.sensitivity * nmse_at(e, e.type);
    return std::max(0.0, mse);
  }

  uint64_t predicted_file_bytes() const {
    int64_t file = int64_t(size_.file_bytes);
    for (const auto& [unit, bytes] : unit_bytes_) {
      const auto it = size_.unit_bytes.find(unit);
      const int64_t before = it != size_.unit_bytes.end() ? int64_t(it->second) : 0;
      file += int64_t(aligned(bytes)) - int64_t(aligned(before));
    }
    return uint64_t(std::max<int64_t>(0, file));
  }

  uint64_t tensor_bytes() const {
    uint64_t n = 0;
    for (const auto& e : entries_) n += uint64_t(bytes_at(e, e.type));
    return n;
  }

  std::vector<PolicyChoice> choices() const {
    std::vector<PolicyChoice> out;
    for (const auto& e : entries_) {
      if (!e.chosen) continue;
      PolicyChoice c;
      c.name = e.tensor->name;
      c.unit = e.tensor->unit;
      c.group = e.group;
      c.minimum = e.minimum;
      c.candidate = e.tensor->type;
      c.type = e.type;
      c.nmse = nmse_at(e, e.type);
      c.bytes = uint64_t(bytes_at(e, e.type));
      c.sensitivity = e.sensitivity;
      out.push_back(c);
    }
    std::sort(out.begin(), out.end(),
              [](const PolicyChoice& a, const PolicyChoice& b) { return a.name < b.name; });
    return out;
  }

  double calibration() const { return calibration_; }

 private:
  struct Entry {
    const TensorError* tensor = nullptr;
    std::string group;
    bool chosen = false;  // listed in the policy; the search picks its type
    DType minimum = DType::Q4;
    DType type = DType::Q4;
    double sensitivity = 0;
  };
  struct Upgrade {
    double gain_per_byte;
    size_t tensor;
    int from;
    bool operator<(const Upgrade& o) const { return gain_per_byte < o.gain_per_byte; }
  };

  static double nmse_at(const Entry& e, DType type) {
    if (type == e.tensor->type) return e.tensor->error.nmse;
    return alternative(*e.tensor, type)->nmse;
  }
  static int64_t bytes_at(const Entry& e, DType type) {
    if (type == e.tensor->type) return int64_t(e.tensor->bytes);
    return int64_t(alternative(*e.tensor, type)->bytes);
  }
  uint64_t aligned(int64_t bytes) const {
    return align_up(uint64_t(std::max<int64_t>(0, bytes)), std::max<uint64_t>(1, size_.alignment));
  }

  PolicyGoal goal_;
  SizeModel size_;
  std::vector<Entry> entries_;
  std::map<std::string, int64_t> unit_bytes_;  // current stored bytes per unit
  double calibration_ = 0;
  double arithmetic_floor_ = 0;  // image MSE of the candidate's arithmetic alone (VAE, attention)
};

bool goal_met(const PolicyGoal& goal, double psnr, uint64_t file_bytes) {
  return (!goal.min_psnr_db || psnr >= *goal.min_psnr_db) &&
         (!goal.max_bytes || file_bytes <= *goal.max_bytes);
}

std::string policy_text(const PolicyProposal& p) {
  std::ostringstream s;
  s << "# Precision policy proposed by klein report (greedy on measured sensitivity).\n# Goal:";
  if (p.goal.min_psnr_db)
    s << " image PSNR >= " << db(*p.goal.min_psnr_db) << " against the reference;";
  if (p.goal.max_bytes) s << " file size <= " << mb(*p.goal.max_bytes) << ";";
  s << (p.met ? " met" : " NOT met (the closest the search got)")
    << (p.verified ? " as measured\n" : " as predicted\n");
  s << "# Predicted: " << mb(p.predicted_file_bytes) << ", image PSNR "
    << db(p.predicted_psnr_db) << "\n";
  if (p.measured_psnr_db && p.measured_file_bytes)
    s << "# Measured (converted and run): " << mb(*p.measured_file_bytes) << ", image PSNR "
      << db(*p.measured_psnr_db) << "\n";
  s << "# Candidate the search started from: " << mb(p.candidate_file_bytes) << ", image PSNR "
    << db(p.candidate_psnr_db) << "\n";
  s << "# Tensors not listed keep the built-in defaults. Use with:\n"
    << "#   klein convert -m REFERENCE -t q4 --policy THIS_FILE -o OUTPUT.klein\n";
  size_t width = 0;
  for (const auto& t : p.tensors) width = std::max(width, t.name.size());
  for (const auto& t : p.tensors)
    s << t.name << std::string(width + 2 - t.name.size(), ' ')
      << convert::storage_type_name(t.type) << "\n";
  return s.str();
}

// The proposal of the current state, as predicted.
PolicyProposal proposal_of(const Search& search, const PolicyGoal& goal) {
  PolicyProposal p;
  p.goal = goal;
  p.tensors = search.choices();
  p.predicted_file_bytes = search.predicted_file_bytes();
  p.predicted_tensor_bytes = search.tensor_bytes();
  p.predicted_image_mse = search.predicted_mse();
  p.predicted_psnr_db = psnr_from_mse(p.predicted_image_mse);
  p.calibration = search.calibration();
  p.met = goal_met(goal, p.predicted_psnr_db, p.predicted_file_bytes);
  return p;
}

PolicyRound round_of(const PolicyProposal& p) {
  PolicyRound r;
  r.predicted_file_bytes = p.predicted_file_bytes;
  r.predicted_psnr_db = p.predicted_psnr_db;
  for (const auto& t : p.tensors) ++r.types[convert::storage_type_name(t.type)];
  return r;
}

}  // namespace

double psnr_from_mse(double mse) {
  return mse > 0 ? 10 * std::log10(1 / mse) : std::numeric_limits<double>::infinity();
}

PolicyProposal search_policy(const WeightComparison& weights, const E2eResult& e2e,
                             const PolicyGoal& goal, const SizeModel& size, int verify_rounds,
                             const MeasureFn& measure) {
  check(goal.min_psnr_db || goal.max_bytes, "policy search: give a PSNR goal or a size budget");
  Search search(weights, goal, size);
  search.calibrate(e2e, true);
  search.upgrade();
  PolicyProposal p = proposal_of(search, goal);
  std::vector<PolicyRound> rounds = {round_of(p)};
  for (int round = 0; measure && round < verify_rounds; ++round) {
    p.text = policy_text(p);
    const Measurement m = measure(p.text);
    const double psnr = psnr_from_mse(m.e2e.mean_image_mse);
    rounds.back().measured_file_bytes = m.file_bytes;
    rounds.back().measured_psnr_db = psnr;
    p.verified = true;
    p.measured_file_bytes = m.file_bytes;
    p.measured_psnr_db = psnr;
    p.met = goal_met(goal, psnr, m.file_bytes);
    // More precision can only help a PSNR goal, and only within the size budget.
    // The answer is always a measured proposal: no new one without a round to verify it.
    if (p.met || !goal.min_psnr_db || psnr >= *goal.min_psnr_db) break;
    if (goal.max_bytes && m.file_bytes > *goal.max_bytes) break;
    if (round + 1 == verify_rounds) break;
    search.calibrate(m.e2e, false);
    if (!search.upgrade()) break;
    p = proposal_of(search, goal);
    rounds.push_back(round_of(p));
  }
  p.rounds = std::move(rounds);
  p.candidate_file_bytes = size.file_bytes;
  p.candidate_image_mse = e2e.mean_image_mse;
  p.candidate_psnr_db = psnr_from_mse(e2e.mean_image_mse);
  p.text = policy_text(p);
  return p;
}

uint64_t parse_size(const std::string& text, const std::string& what) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    fail(what, " ", text, ": expected a size such as 2.5GB, 800MB or 123456 (bytes)");
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "K" || unit == "KB") scale = 1e3;
  if (unit == "M" || unit == "MB") scale = 1e6;
  if (unit == "G" || unit == "GB") scale = 1e9;
  if (unit == "KIB") scale = 1024.0;
  if (unit == "MIB") scale = 1024.0 * 1024;
  if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  check(scale > 0 && value > 0 && std::isfinite(value), what, " ", text,
        ": expected a size such as 2.5GB, 800MB or 123456 (bytes)");
  return uint64_t(value * scale);
}

}  // namespace klein::report
