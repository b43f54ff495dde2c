#pragma once
// Book-keeping shared by the stores that page: which units are resident (held, read ahead,
// or kept), how many bytes that is, the peak, and the observer. Not thread-safe: the store
// calls it under its own lock. A unit's entry is made the first time it is seen and kept, so
// paging a unit in and out again allocates nothing.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace klein {

// What a store does with a unit's pages once nobody holds the unit.
//   Paged     drops them from the process (madvise DONTNEED; they stay in the page cache
//             while memory allows) and reads the next unit ahead while one computes: memory
//             follows the units in use, about two at a time.
//   Resident  keeps every unit it has paged in until release() says a network is done:
//             fastest when the machine has the memory.
enum class Residency { Paged, Resident };
const char* residency_name(Residency r);  // "paged", "resident"

// What the store did with a unit, for tests and memory reports.
enum class UnitEvent {
  Prefetch,  // reading ahead started; the unit counts as resident from here
  Acquire,   // a reference was handed out (also when it was resident already)
  Drop,      // its pages were dropped; no longer resident
};
using UnitObserver = std::function<void(const std::string& unit, UnitEvent event)>;

// Units a store has made resident and not dropped (held, read ahead, or kept by a resident
// store), now and at their peak since the store opened or reset_peak() was called; and the
// time callers spent inside acquire() since the store opened (checks of pages that came in,
// waits for a check under way, the page-in book-keeping): serial time of whoever runs the
// network.
struct ResidencyStats {
  size_t units = 0;
  uint64_t bytes = 0;
  size_t peak_units = 0;
  uint64_t peak_bytes = 0;
  double acquire_seconds = 0;
};


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
  void acquire_took(double seconds) { stats_.acquire_seconds += seconds; }
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
