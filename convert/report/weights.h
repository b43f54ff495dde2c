#pragma once
// Tensor by tensor: every tensor of the candidate against the same tensor of the reference,
// both dequantized to float32 in slices of rows (never a whole large tensor in memory), one
// unit of each store resident at a time.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "ops/compute.h"
#include "convert/report/metrics.h"
#include "weights/weight_store.h"

namespace klein::report {

// What a tensor would cost at another storage type: measured by quantizing the reference
// values with the converter's own quantizers (for the policy search).
struct Alternative {
  DType type = DType::BF16;
  double nmse = 0;
  uint64_t bytes = 0;
};

struct TensorError {
  std::string name;       // canonical
  std::string unit;       // "transformer.double.3"
  std::string component;  // "transformer", "text_encoder", "vae"
  Shape shape;
  DType reference_type = DType::BF16;
  DType type = DType::BF16;  // the candidate's
  uint8_t layout = 0;        // the candidate's quant::Layout
  uint64_t bytes = 0;        // the candidate's stored bytes
  uint64_t reference_bytes = 0;
  ErrorSummary error;
  std::vector<Alternative> alternatives;  // only when asked for

  int64_t numel() const { return klein::numel(shape); }
  double bits_per_weight() const;
};

// Totals over a set of tensors (a unit, a component, the model). Aggregated metrics are
// over all the values together: NMSE = Σd² / Σr² over every tensor of the group, so large
// tensors weigh as much as their values do.
struct GroupTotals {
  std::string name;
  size_t tensors = 0;
  int64_t parameters = 0;
  uint64_t bytes = 0, reference_bytes = 0;
  ErrorStats stats;
  std::string worst_tensor;  // highest NMSE; "" when every tensor is exact
  double worst_nmse = 0;

  void add(const TensorError& t, const ErrorStats& s);
  double bits_per_weight() const;
};

struct WeightComparison {
  std::vector<TensorError> tensors;     // worst first (NMSE descending, then by name)
  std::vector<GroupTotals> units;       // in the candidate's unit order
  std::vector<GroupTotals> components;  // in order of first appearance
  GroupTotals total;
  ErrorHistogram histogram;
  std::vector<std::string> reference_only;  // units / tensors the candidate does not hold
};

struct CompareOptions {
  bool alternatives = false;  // measure q4, q8 and bf16 for every tensor that can hold them
  std::function<void(size_t done, size_t total, const std::string& unit)> progress;
};

// Throws naming the tensor when the two models do not match (a candidate tensor or unit the
// reference lacks, a different shape) or when the reference holds a quantized tensor.
WeightComparison compare_weights(WeightStore& reference, WeightStore& candidate,
                                 Compute& cx, const CompareOptions& options = {});

// "transformer.double.3" -> "transformer".
std::string component_of(const std::string& unit);

}  // namespace klein::report
