#include "weights/source_store.h"

#include <cstring>

#include "core/error.h"

namespace klein {

namespace {

class SourceUnit final : public WeightUnit {
 public:
  SourceUnit(std::string name, std::string prefix) : WeightUnit(std::move(name), std::move(prefix)) {}
  using WeightUnit::add;
  // Buffers for tensors that could not be plain views.
  std::vector<std::vector<std::byte>> owned;
};

}  // namespace

SourceStore::SourceStore(std::vector<SourceComponent> components, ModelConfig config,
                         std::string identity)
    : components_(std::move(components)), config_(std::move(config)), identity_(std::move(identity)) {
  for (const auto& c : components_)
    for (const auto& t : c.tensors) {
      auto u = unit_of(t.canonical);
      if (!u) continue;  // never read by inference
      units_[u->unit].push_back({&c, &t});
      prefixes_[u->unit] = u->prefix;
    }
}

std::vector<std::string> SourceStore::units() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : units_) out.push_back(name);
  return out;
}

UnitRef SourceStore::acquire(const std::string& unit) {
  std::lock_guard lock(mutex_);
  if (auto it = live_.find(unit); it != live_.end())
    if (auto held = it->second.lock()) return held;
  auto it = units_.find(unit);
  if (it == units_.end()) fail("the model has no weight unit ", unit);
  auto u = std::make_shared<SourceUnit>(unit, prefixes_[unit]);
  for (const auto& p : it->second) {
    const TensorSource& src = *p.source;
    const auto* located = p.component->files->find(src.source);
    check(located != nullptr, "internal: tensor ", src.source, " vanished");
    const TensorView v = located->file->view(*located->entry);
    Weight w;
    w.name = src.canonical;
    w.dtype = v.dtype;
    w.shape = v.shape;
    w.data = v.data;
    w.nbytes = v.nbytes;
    if (src.row_end >= 0) {
      const size_t row_bytes = v.nbytes / size_t(v.shape[0]);
      w.shape[0] = src.row_end - src.row_begin;
      w.data = static_cast<const std::byte*>(v.data) + size_t(src.row_begin) * row_bytes;
      w.nbytes = size_t(w.shape[0]) * row_bytes;
    }
    if (src.squeeze_1x1) w.shape = {w.shape[0], w.shape[1]};
    if (src.swap_halves) {
      // Rebuild [second half; first half] so the model always sees diffusers' order.
      std::vector<std::byte> buf(w.nbytes);
      const size_t half = w.nbytes / 2;
      std::memcpy(buf.data(), static_cast<const std::byte*>(w.data) + half, half);
      std::memcpy(buf.data() + half, w.data, half);
      u->owned.push_back(std::move(buf));
      w.data = u->owned.back().data();
    }
    u->add(std::move(w));
  }
  live_[unit] = u;
  return u;
}

}  // namespace klein
