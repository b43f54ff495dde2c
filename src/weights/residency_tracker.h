#pragma once
// Book-keeping shared by the stores that page: which units are resident (held, read ahead,
// or kept), how many bytes that is, the peak, and the observer. Not thread-safe: the store
// calls it under its own lock.
#include <algorithm>
#include <map>
#include <string>

#include "weights/weight_store.h"

namespace klein {

class ResidencyTracker {
 public:
  void set_observer(UnitObserver o) { observer_ = std::move(o); }
  void prefetched(const std::string& unit, uint64_t bytes) {
    add(unit, bytes);
    if (observer_) observer_(unit, UnitEvent::Prefetch);
  }
  void acquired(const std::string& unit, uint64_t bytes) {
    add(unit, bytes);
    if (observer_) observer_(unit, UnitEvent::Acquire);
  }
  void dropped(const std::string& unit) {
    auto it = resident_.find(unit);
    if (it == resident_.end()) return;
    stats_.bytes -= it->second;
    resident_.erase(it);
    stats_.units = resident_.size();
    if (observer_) observer_(unit, UnitEvent::Drop);
  }
  bool resident(const std::string& unit) const { return resident_.count(unit) > 0; }
  ResidencyStats stats() const { return stats_; }
  void reset_peak() {
    stats_.peak_units = stats_.units;
    stats_.peak_bytes = stats_.bytes;
  }

 private:
  void add(const std::string& unit, uint64_t bytes) {
    if (!resident_.emplace(unit, bytes).second) return;
    stats_.bytes += bytes;
    stats_.units = resident_.size();
    stats_.peak_units = std::max(stats_.peak_units, stats_.units);
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes);
  }

  std::map<std::string, uint64_t> resident_;
  ResidencyStats stats_;
  UnitObserver observer_;
};

}  // namespace klein
