#pragma once
// A fixed pool of worker threads for data-parallel loops. The calling thread takes part,
// so ThreadPool(1) runs everything inline. One pool per engine context, no globals.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace klein {

class ThreadPool {
 public:
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

 private:
  void worker_loop(int index);
  void run(int64_t n, const TaskFn& fn);
  void take_tasks(const TaskFn& fn, int worker, std::unique_lock<std::mutex>& lock);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const TaskFn* job_ = nullptr;
  int64_t job_tasks_ = 0;
  int64_t next_task_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace klein
