#pragma once
// Progress of long work, reported to whoever drives the engine. The engine never prints;
// the CLI turns these events into a terminal line, JSON events, or nothing (--quiet).
#include <chrono>
#include <string>

namespace klein {

struct MemoryPlan;

class Progress {
 public:
  virtual ~Progress() = default;
  // A named phase starts ("load", "text encoder", "denoise", "vae decode", ...); `total` is
  // its number of steps (0 when it has none worth counting).
  virtual void begin(const std::string& phase, int total) {}
  // Step `done` of `total` of the current phase finished.
  virtual void step(const std::string& phase, int done, int total) {}
  virtual void end(const std::string& phase, double seconds) {}
  // Something the user should know (a size rounded down, tokens dropped, ...).
  virtual void warn(const std::string& message) {}
  // The memory decision, before the first network runs (pipeline/memory_plan.h).
  virtual void memory_plan(const MemoryPlan& plan) {}
};

// Times a phase and reports begin/end around a scope.
class Phase {
 public:
  Phase(Progress& p, std::string name, int total = 0)
      : progress_(p), name_(std::move(name)), start_(std::chrono::steady_clock::now()) {
    progress_.begin(name_, total);
  }
  ~Phase() { progress_.end(name_, seconds()); }
  void step(int done, int total) { progress_.step(name_, done, total); }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  Progress& progress_;
  std::string name_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace klein
