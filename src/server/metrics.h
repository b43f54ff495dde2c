#pragma once
// What `klein serve` counts for a fleet's scraper and autoscaler, written in the Prometheus
// text exposition format (version 0.0.4): one `# HELP` and one `# TYPE` line per metric, then
// its samples. Counters end in `_total`; the histogram has `_bucket{le=...}`, `_sum` and
// `_count`. Thread-safe: the handlers and the generating thread add, /metrics renders.
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace klein {

class Metrics {
 public:
  // Upper bounds (seconds) of the generation-time histogram: a tiny image on a fast machine
  // takes under a second, a large one on a small machine minutes.
  static constexpr double kSecondsBuckets[] = {0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200};

  // One image made for a request that came through `route`, in `seconds` (start to decoded).
  void image_done(const std::string& route, double seconds);
  // A request of `route` that ended in an error of `kind` ("bad_request", "unauthorized",
  // "queue_full", "cancelled", "not_ready", "not_found", "internal", ...).
  void error(const std::string& route, const std::string& kind);
  // A pipeline phase ("text encoder", "denoise", "vae decode", ...) took `seconds`.
  void phase(const std::string& name, double seconds);

  // The values that are read when rendered rather than counted.
  struct Gauges {
    int queue = 0;          // requests waiting for their turn (synchronous and jobs)
    bool running = false;   // a generation is running
    bool ready = false;     // the model is open
    int jobs = 0;           // asynchronous jobs kept (any state)
    uint64_t peak_rss = 0;  // bytes
  };
  std::string render(const Gauges& g) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, uint64_t> images_;                          // route -> count
  std::map<std::pair<std::string, std::string>, uint64_t> errors_;  // (route, kind) -> count
  std::map<std::string, double> phase_seconds_;                     // phase -> seconds
  std::vector<uint64_t> buckets_ = std::vector<uint64_t>(std::size(kSecondsBuckets), 0);
  uint64_t count_ = 0;  // observations of the histogram
  double sum_ = 0;
};

}  // namespace klein
