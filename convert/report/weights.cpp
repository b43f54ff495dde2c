#include "convert/report/weights.h"

#include <algorithm>
#include <map>
#include <set>

#include "convert/storage.h"
#include "core/error.h"
#include "quant/matmul.h"

namespace klein::report {

namespace {

// Rows per slice: about a million values, in whole groups of 16 rows so that a slice of an
// interleaved quantized matrix starts at a tile boundary.
constexpr int64_t kSliceValues = 1 << 20;
constexpr int64_t kRowGroup = 16;

// The 2-D view a tensor is compared in: rows = first dimension, cols = the rest; vectors
// and scalars as one row, so that the histogram measures them against their own RMS.
quant::Matrix matrix_of(const Weight& w) {
  quant::Matrix m;
  m.type = w.dtype;
  m.layout = quant::Layout(w.layout);
  m.rows = w.shape.size() < 2 ? 1 : w.shape[0];
  m.cols = w.numel() / m.rows;
  m.data = w.data;
  m.nbytes = w.nbytes;
  return m;
}

// The storage types the policy search chooses between.
constexpr DType kAlternativeTypes[] = {DType::Q4, DType::Q8, DType::BF16};

// Per worker: the buffers of one slice and the sums so far.
struct SliceWork {
  std::vector<float> ref, cand, alt;
  std::vector<uint8_t> packed;
  ErrorStats stats;
  ErrorHistogram histogram;
  std::vector<ErrorStats> alternatives;
};

// ref -> type -> float32 again, as the converter would store it (row-major blocks; the
// values are the same in any layout).
void round_trip(const float* ref, int64_t rows, int64_t cols, DType type, SliceWork& w) {
  const size_t bytes = quant::storage_bytes(type, quant::Layout::RowMajor, rows, cols);
  w.packed.resize(bytes);
  quant::pack(ref, rows, cols, type, quant::Layout::RowMajor, w.packed.data());
  quant::Matrix m;
  m.type = type;
  m.rows = rows;
  m.cols = cols;
  m.data = w.packed.data();
  m.nbytes = bytes;
  w.alt.resize(size_t(rows * cols));
  quant::unpack_rows(m, 0, rows, w.alt.data());
}

std::vector<DType> alternative_types(const Shape& shape) {
  std::vector<DType> types;
  for (DType t : kAlternativeTypes)
    if (convert::can_store(t, shape)) types.push_back(t);
  return types;
}

struct Compared {
  TensorError tensor;
  ErrorStats stats;
};

Compared compare_tensor(const Weight& ref, const Weight& cand, const std::string& unit,
                        const CompareOptions& options, Compute& cx,
                        ErrorHistogram& histogram) {
  const quant::Matrix r = matrix_of(ref), c = matrix_of(cand);
  const int64_t rows_per_slice =
      std::max<int64_t>(kRowGroup, kSliceValues / std::max<int64_t>(r.cols, 1) / kRowGroup *
                                       kRowGroup);
  const int64_t slices = (r.rows + rows_per_slice - 1) / rows_per_slice;
  const std::vector<DType> alt_types =
      options.alternatives ? alternative_types(ref.shape) : std::vector<DType>{};

  std::vector<SliceWork> work(size_t(cx.threads()));
  for (auto& w : work) w.alternatives.resize(alt_types.size());
  cx.pool().parallel_for(slices, [&](int64_t begin, int64_t end, int worker) {
    SliceWork& w = work[size_t(worker)];
    for (int64_t s = begin; s < end; ++s) {
      const int64_t r0 = s * rows_per_slice, r1 = std::min(r.rows, r0 + rows_per_slice);
      const size_t n = size_t((r1 - r0) * r.cols);
      w.ref.resize(n);
      w.cand.resize(n);
      quant::unpack_rows(r, r0, r1, w.ref.data());
      quant::unpack_rows(c, r0, r1, w.cand.data());
      w.stats.add(w.ref.data(), w.cand.data(), int64_t(n));
      for (int64_t row = 0; row < r1 - r0; ++row)
        w.histogram.add_row(w.ref.data() + row * r.cols, w.cand.data() + row * r.cols, r.cols);
      for (size_t a = 0; a < alt_types.size(); ++a) {
        round_trip(w.ref.data(), r1 - r0, r.cols, alt_types[a], w);
        w.alternatives[a].add(w.ref.data(), w.alt.data(), int64_t(n));
      }
    }
  });

  Compared out;
  std::vector<ErrorStats> alt_stats(alt_types.size());
  for (const auto& w : work) {
    out.stats.merge(w.stats);
    histogram.merge(w.histogram);
    for (size_t a = 0; a < alt_types.size(); ++a) alt_stats[a].merge(w.alternatives[a]);
  }
  TensorError& t = out.tensor;
  t.name = cand.name;
  t.unit = unit;
  t.component = component_of(unit);
  t.shape = cand.shape;
  t.reference_type = ref.dtype;
  t.type = cand.dtype;
  t.layout = cand.layout;
  t.bytes = cand.nbytes;
  t.reference_bytes = ref.nbytes;
  t.error = summarize(out.stats);
  for (size_t a = 0; a < alt_types.size(); ++a) {
    const convert::StorageFormat f = convert::storage_format(alt_types[a]);
    t.alternatives.push_back(
        {alt_types[a], alt_stats[a].nmse(), convert::storage_size(f, r.rows, r.cols)});
  }
  return out;
}

void check_pair(const Weight& ref, const Weight& cand) {
  check(dtype_is_float(ref.dtype), "reference tensor ", ref.name, " is stored as ",
        dtype_name(ref.dtype),
        "; the reference must be the source checkpoint or a BF16/F16/F32 container");
  check(ref.shape == cand.shape, "tensor ", cand.name, ": the candidate's shape ",
        shape_str(cand.shape), " differs from the reference's ", shape_str(ref.shape),
        " (not the same model?)");
}

GroupTotals& group(std::vector<GroupTotals>& groups, const std::string& name) {
  for (auto& g : groups)
    if (g.name == name) return g;
  groups.push_back({});
  groups.back().name = name;
  return groups.back();
}

}  // namespace

double TensorError::bits_per_weight() const {
  return numel() > 0 ? double(bytes) * 8 / double(numel()) : 0.0;
}

void GroupTotals::add(const TensorError& t, const ErrorStats& s) {
  ++tensors;
  parameters += t.numel();
  bytes += t.bytes;
  reference_bytes += t.reference_bytes;
  stats.merge(s);
  if (t.error.nmse > worst_nmse) {  // none for a group without error
    worst_tensor = t.name;
    worst_nmse = t.error.nmse;
  }
}

double GroupTotals::bits_per_weight() const {
  return parameters > 0 ? double(bytes) * 8 / double(parameters) : 0.0;
}

std::string component_of(const std::string& unit) { return unit.substr(0, unit.find('.')); }

WeightComparison compare_weights(WeightStore& reference, WeightStore& candidate,
                                 Compute& cx, const CompareOptions& options) {
  WeightComparison out;
  out.total.name = "total";
  const std::vector<std::string> units = candidate.units();
  const std::set<std::string> candidate_units(units.begin(), units.end());
  for (const auto& u : reference.units())
    if (!candidate_units.count(u)) out.reference_only.push_back(u);

  for (size_t i = 0; i < units.size(); ++i) {
    const std::string& u = units[i];
    check(reference.has_unit(u), "the candidate's unit ", u,
          " is not in the reference (not the same model?)");
    const UnitRef cand = candidate.acquire(u);
    const UnitRef ref = reference.acquire(u);
    std::map<std::string, const Weight*> by_name;
    for (const auto& w : ref->weights()) by_name[w.name] = &w;
    GroupTotals& unit_totals = group(out.units, u);
    for (const auto& w : cand->weights()) {
      auto it = by_name.find(w.name);
      check(it != by_name.end(), "the candidate's tensor ", w.name,
            " is not in the reference (not the same model?)");
      check_pair(*it->second, w);
      Compared c = compare_tensor(*it->second, w, u, options, cx, out.histogram);
      by_name.erase(it);
      unit_totals.add(c.tensor, c.stats);
      group(out.components, c.tensor.component).add(c.tensor, c.stats);
      out.total.add(c.tensor, c.stats);
      out.tensors.push_back(std::move(c.tensor));
    }
    for (const auto& [name, w] : by_name) out.reference_only.push_back(name);
    if (options.progress) options.progress(i + 1, units.size(), u);
  }
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const TensorError& a, const TensorError& b) {
                     if (a.error.nmse != b.error.nmse) return a.error.nmse > b.error.nmse;
                     return a.name < b.name;
                   });
  return out;
}

}  // namespace klein::report
