#include "weights/weight_store.h"

#include "core/error.h"

namespace klein {

const Weight* WeightUnit::find(std::string_view relative) const {
  // Compared in two pieces, prefix and rest, so that a lookup never builds a string.
  for (const auto& w : weights_) {
    const std::string_view name = w.name;
    if (name.size() == prefix_.size() + relative.size() && name.starts_with(prefix_) &&
        name.substr(prefix_.size()) == relative)
      return &w;
  }
  return nullptr;
}

const Weight& WeightUnit::get(std::string_view relative) const {
  const Weight* w = find(relative);
  if (!w) fail("weight unit ", name_, " has no tensor ", prefix_, relative);
  return *w;
}

std::vector<float> weight_to_floats(const Weight& w) {
  check(dtype_is_float(w.dtype) && w.layout == 0, "tensor ", w.name, " is stored as ",
        dtype_name(w.dtype), "; expected a plain float type for a small tensor");
  std::vector<float> out(static_cast<size_t>(w.numel()));
  to_f32(w.dtype, w.data, out.data(), out.size());
  return out;
}

const char* residency_name(Residency r) {
  return r == Residency::Paged ? "paged" : "resident";
}

std::string double_block_unit(int64_t i) { return "transformer.double." + std::to_string(i); }
std::string single_block_unit(int64_t i) { return "transformer.single." + std::to_string(i); }
std::string text_layer_unit(int64_t layer) { return "text_encoder.layer." + std::to_string(layer); }

void WeightStore::set_observer(UnitObserver observer) {
  std::lock_guard lock(mutex_);
  tracker_.set_observer(std::move(observer));
}

void WeightStore::set_read_ahead(bool on) {
  std::lock_guard lock(mutex_);
  read_ahead_ = on;
}

bool WeightStore::read_ahead() const {
  std::lock_guard lock(mutex_);
  return read_ahead_;
}

ResidencyStats WeightStore::residency_stats() const {
  std::lock_guard lock(mutex_);
  return tracker_.stats();
}

void WeightStore::reset_peak() {
  std::lock_guard lock(mutex_);
  tracker_.reset_peak();
}

}  // namespace klein
