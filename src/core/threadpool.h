#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part,
// so ThreadPool(1) runs everything inline. One pool per engine context, no globals.
//
// A step of the transformer is several hundred loops one after the other, with little serial
// work between them. Waking a sleeping thread costs tens to hundreds of microseconds (far
// more in a VM, where the idle CPU was handed back to the host), and that latency is paid by
// every loop and on every thread. So a worker that finishes a loop watches for the next one
// for a short while (kSpinMicroseconds) before it sleeps, tasks are handed out with an atomic
// counter rather than under a lock, and the caller waits for the stragglers the same way.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace klein {

class ThreadPool {
 public:
  // How long an idle worker (or the caller waiting for workers) keeps watching before it
  // sleeps. Long enough to bridge the serial work between two loops of a step, short enough
  // that an idle pool stops using the CPU at once to a person's eye.
  static constexpr int kSpinMicroseconds = 50;

  // threads <= 0: one per usable CPU (usable_cpus()); more than kMaxThreads is refused.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Calls fn(begin, end, worker) on disjoint ranges covering [0, n), split into about
  // `size()` contiguous chunks (never smaller than min_chunk). Blocks until all are done.
  // Exceptions thrown by fn are rethrown here (the first one). Neither call allocates.
  using RangeFn = FunctionRef<void(int64_t begin, int64_t end, int worker)>;
  void parallel_for(int64_t n, const RangeFn& fn, int64_t min_chunk = 1);

  // Calls fn(task, worker) for task in [0, n), handing tasks out dynamically (for uneven work).
  using TaskFn = FunctionRef<void(int64_t task, int worker)>;
  void for_each_task(int64_t n, const TaskFn& fn);

  // What the pool has done since it was made: loops handed to the workers (each one a
  // synchronisation of every thread), and the time the caller spent waiting for workers
  // after its own share of them (late starts and uneven ends). Read between loops.
  struct Stats {
    int64_t jobs = 0;
    double caller_wait_seconds = 0;
  };
  Stats stats() const;

 private:
  void worker_loop(int index);
  void run(int64_t n, const TaskFn& fn);
  void take_tasks(int worker);
  // Spins up to kSpinMicroseconds for done() to hold, then sleeps on `cv` until it does
  // (whoever makes it hold notifies `cv` holding mutex_).
  template <class Done>
  void await(std::condition_variable& cv, Done done);

  std::vector<std::thread> workers_;
  std::mutex mutex_;  // for sleeping and waking, and error_
  std::condition_variable wake_;
  std::condition_variable done_;
  // The current job: written by the caller before generation_ moves on (release), read by
  // the workers after they see it move (acquire).
  const TaskFn* job_ = nullptr;
  int64_t job_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  std::atomic<int> active_{0};  // workers that have not finished the current job
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
  int64_t jobs_ = 0;
  int64_t caller_wait_ns_ = 0;
};

}  // namespace klein
