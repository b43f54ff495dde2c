#include "core/threadpool.h"

#include "core/cpu.h"
#include "core/error.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace klein {
namespace {

// Tells the core that this thread is waiting (frees the sibling hyperthread, saves power).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = usable_cpus();
  check(threads <= kMaxThreads, "threads: ", threads, " is more than this program runs (at most ",
        kMaxThreads, "; this machine has ", usable_cpus(), " usable CPUs)");
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_.store(true);
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

ThreadPool::Stats ThreadPool::stats() const {
  return {jobs_, double(caller_wait_ns_) * 1e-9};
}

template <class Done>
void ThreadPool::await(std::condition_variable& cv, Done done) {
  // A few microseconds of pausing, then yielding the CPU between looks: where the machine has
  // more runnable threads than cores (tests side by side, a second program), the thread that
  // is waited for gets the core instead of this one.
  const int64_t until = now_ns() + int64_t(kSpinMicroseconds) * 1000;
  for (int spins = 1; !done(); ++spins) {
    if (spins < 64) {
      cpu_relax();
    } else if (now_ns() < until) {
      std::this_thread::yield();
    } else {
      std::unique_lock lock(mutex_);
      cv.wait(lock, done);
      return;
    }
  }
}

// Runs tasks of the current job as `worker` until none is left. The first exception is kept
// for the caller and ends the handing out.
void ThreadPool::take_tasks(int worker) {
  const TaskFn& fn = *job_;
  for (int64_t task; (task = next_task_.fetch_add(1, std::memory_order_relaxed)) < job_tasks_;) {
    try {
      fn(task, worker);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      next_task_.store(job_tasks_, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::run(int64_t n, const TaskFn& fn) {
  // Every worker finished the previous job (active_ reached 0), so none reads these now.
  job_ = &fn;
  job_tasks_ = n;
  next_task_.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  active_.store(int(workers_.size()), std::memory_order_relaxed);
  {
    // Under the lock, so that a worker about to sleep sees either the new generation or the
    // notification.
    std::lock_guard lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  // The caller works as worker 0.
  take_tasks(0);
  const int64_t t0 = now_ns();
  await(done_, [&] { return active_.load(std::memory_order_acquire) == 0; });
  caller_wait_ns_ += now_ns() - t0;
  ++jobs_;
  job_ = nullptr;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    await(wake_, [&] {
      return stop_.load(std::memory_order_relaxed) ||
             generation_.load(std::memory_order_acquire) != seen;
    });
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    take_tasks(index);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // The caller may be asleep on done_: it checks active_ under the lock.
      std::lock_guard lock(mutex_);
      done_.notify_all();
    }
  }
}

}  // namespace klein
