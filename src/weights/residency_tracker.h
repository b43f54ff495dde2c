#pragma once
// Book-keeping shared by the stores that page: which units are resident (held, read ahead,
// or kept), how many bytes that is, the peak, and the observer. Not thread-safe: the store
// calls it under its own lock. A unit's entry is made the first time it is seen and kept, so
// paging a unit in and out again allocates nothing.
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
    auto it = units_.find(unit);
    if (it == units_.end() || !it->second.resident) return;
    it->second.resident = false;
    stats_.bytes -= it->second.bytes;
    --stats_.units;
    if (observer_) observer_(unit, UnitEvent::Drop);
  }
  bool resident(const std::string& unit) const {
    auto it = units_.find(unit);
    return it != units_.end() && it->second.resident;
  }
  ResidencyStats stats() const { return stats_; }
  void reset_peak() {
    stats_.peak_units = stats_.units;
    stats_.peak_bytes = stats_.bytes;
  }

 private:
  void add(const std::string& unit, uint64_t bytes) {
    auto it = units_.find(unit);
    if (it == units_.end()) it = units_.emplace(unit, Entry{}).first;
    if (it->second.resident) return;
    it->second = {bytes, true};
    stats_.bytes += bytes;
    ++stats_.units;
    stats_.peak_units = std::max(stats_.peak_units, stats_.units);
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.bytes);
  }

  struct Entry {
    uint64_t bytes = 0;
    bool resident = false;
  };
  std::map<std::string, Entry> units_;
  ResidencyStats stats_;
  UnitObserver observer_;
};

}  // namespace klein
