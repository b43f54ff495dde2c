#include "core/threadpool.h"

#include "core/cpu.h"
#include "core/error.h"

#include <algorithm>
#include <atomic>

namespace klein {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = usable_cpus();
  check(threads <= kMaxThreads, "threads: ", threads, " is more than this program runs (at most ",
        kMaxThreads, "; this machine has ", usable_cpus(), " usable CPUs)");
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const RangeFn& fn, int64_t min_chunk) {
  if (n <= 0) return;
  const int64_t chunk = std::max<int64_t>(min_chunk, (n + size() - 1) / size());
  const int64_t chunks = (n + chunk - 1) / chunk;
  if (chunks == 1) return fn(0, n, 0);
  for_each_task(chunks, [&](int64_t c, int worker) {
    fn(c * chunk, std::min(n, (c + 1) * chunk), worker);
  });
}

void ThreadPool::for_each_task(int64_t n, const TaskFn& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  run(n, fn);
}

// Runs tasks of the current job as `worker` until none is left; called and returning with
// the lock held. The first exception is kept for the caller and ends the handing out.
void ThreadPool::take_tasks(const TaskFn& fn, int worker, std::unique_lock<std::mutex>& lock) {
  while (next_task_ < job_tasks_) {
    const int64_t task = next_task_++;
    lock.unlock();
    try {
      fn(task, worker);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      next_task_ = job_tasks_;
      continue;
    }
    lock.lock();
  }
}

// Hands out task indices under the lock; tasks are coarse (a chunk of rows or a tile),
// so the lock is not contended.
void ThreadPool::run(int64_t n, const TaskFn& fn) {
  std::unique_lock lock(mutex_);
  job_ = &fn;
  job_tasks_ = n;
  next_task_ = 0;
  error_ = nullptr;
  active_ = int(workers_.size());
  ++generation_;
  wake_.notify_all();
  // The caller works as worker 0.
  take_tasks(fn, 0, lock);
  done_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    take_tasks(*job_, index, lock);
    if (--active_ == 0) done_.notify_all();
  }
}

}  // namespace klein
