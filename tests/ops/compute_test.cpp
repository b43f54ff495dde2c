// The compute context's per-worker arenas: a repeated sequence of takes allocates only the
// first time, and level_arenas gives every worker the room the busiest one needed, whichever
// worker ran the largest task (the pool hands tasks out by timing).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>

#include "ops/compute.h"

namespace klein {
namespace {

TEST(Arena, RepeatedTakesAllocateOnlyTheFirstTime) {
  Arena a;
  auto takes = [&] {
    Arena::Scope outer(a);
    (void)outer.take<float>(1000);
    {
      Arena::Scope inner(a);
      (void)inner.take<float>(200000);  // past the first block: a second one
    }
    (void)outer.take<double>(300);
  };
  takes();
  const size_t capacity = a.capacity();
  EXPECT_GE(capacity, a.high_water());
  for (int i = 0; i < 3; ++i) takes();
  EXPECT_EQ(a.capacity(), capacity);  // merged into one block, reused since
}

TEST(Compute, LevelArenasGivesEveryWorkerTheMostAnyHeld) {
  Compute cx(3);
  ASSERT_EQ(cx.threads(), 3);
  // One worker takes a large piece; which one is up to the pool.
  std::atomic<int> taker{-1};
  cx.pool().for_each_task(3, [&](int64_t task, int worker) {
    if (task != 1) return;
    taker = worker;
    Arena::Scope scope(cx.arena(worker));
    (void)scope.take<std::byte>(3 << 20);
  });
  ASSERT_GE(taker.load(), 0);
  size_t most = 0;
  for (int w = 0; w < 3; ++w) most = std::max(most, cx.arena(w).capacity());
  ASSERT_GE(most, size_t(3) << 20);
  int short_of_it = 0;
  for (int w = 0; w < 3; ++w) short_of_it += cx.arena(w).capacity() < (size_t(3) << 20);
  EXPECT_EQ(short_of_it, 2);  // only the taker has the room yet
  cx.level_arenas();
  for (int w = 0; w < 3; ++w) EXPECT_GE(cx.arena(w).capacity(), size_t(3) << 20) << "worker " << w;
}

TEST(ThreadPool, CountsItsLoopsAndRunsTheOneTaskLoopsInline) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.stats().jobs, 0);
  std::atomic<int> sum = 0;
  pool.for_each_task(5, [&](int64_t t, int) { sum += int(t); });
  pool.parallel_for(100, [&](int64_t b, int64_t e, int) { sum += int(e - b); });
  pool.for_each_task(1, [&](int64_t, int worker) { EXPECT_EQ(worker, 0); });  // inline
  EXPECT_EQ(sum.load(), 10 + 100);
  EXPECT_EQ(pool.stats().jobs, 2);
  EXPECT_GE(pool.stats().caller_wait_seconds, 0.0);
}

}  // namespace
}  // namespace klein
