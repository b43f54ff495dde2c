// No heap allocation inside a denoising step after the first: every operator new of this
// test program is counted, and the count may not move between the ends of steps 2, 3 and 4.
// Scratch comes from the compute context's arenas, the thread pool takes its loop bodies by
// reference, and the stores hand out units they keep built.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "pipeline/model_tokenizer.h"
#include "pipeline/pipeline.h"
#include "support/testing.h"
#include "support/tiny_container.h"
#include "weights/container_store.h"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

void* counted(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = align > alignof(std::max_align_t)
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n ? n : 1);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) { return counted(n, 0); }
void* operator new[](std::size_t n) { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted(n, std::size_t(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace klein {
namespace {

namespace fs = std::filesystem;

fs::path tiny_container() { return testing::shared_tiny_container("q8"); }

// Allocations counted between the end of one step and the end of the next, for steps 2..n.
// `extra` runs inside the counted window (to show that the count can move).
std::vector<long> allocations_per_step(WeightStore& store, Residency residency, int threads,
                                       const std::function<void()>& extra = {}) {
  ModelPaths paths;
  paths.model = testing::tiny_model();
  const Tokenizer tokenizer = load_model_tokenizer(paths);
  Compute cx(threads);
  Session session(store, tokenizer, cx);
  GenerateOptions o;
  o.prompt = "a small red cube";
  o.width = 64;
  o.height = 48;
  o.steps = 4;
  o.seed = 5;
  o.residency = residency;
  std::vector<long> per_step;
  long at_last_step = 0;
  Progress quiet;
  session.generate(o, quiet, [&](const StepView& s) {
    counting = false;
    if (s.step >= 1) per_step.push_back(allocations.load() - at_last_step);
    at_last_step = allocations.load();
    counting = true;
    if (s.step >= 1 && extra) extra();
  });
  counting = false;
  return per_step;
}

TEST(Allocations, NoneInsideAStepAfterTheFirstPaged) {
  ContainerStore store(tiny_container());
  for (int threads : {1, 2}) {
    const std::vector<long> n = allocations_per_step(store, Residency::Paged, threads);
    EXPECT_EQ(n, (std::vector<long>{0, 0, 0})) << threads << " threads";
  }
}

TEST(Allocations, NoneInsideAStepAfterTheFirstResident) {
  ContainerStore store(tiny_container());
  const std::vector<long> n = allocations_per_step(store, Residency::Resident, 2);
  EXPECT_EQ(n, (std::vector<long>{0, 0, 0}));
}

TEST(Allocations, NoneInsideAStepOnResidentSafetensors) {
  auto store = open_model(testing::tiny_model());
  const std::vector<long> n = allocations_per_step(*store, Residency::Resident, 2);
  EXPECT_EQ(n, (std::vector<long>{0, 0, 0}));
}

// The counter sees allocations made inside the window (the test above can fail).
TEST(Allocations, TheCounterSeesAnAllocation) {
  ContainerStore store(tiny_container());
  std::vector<int*> kept;
  const std::vector<long> n =
      allocations_per_step(store, Residency::Paged, 2, [&] { kept.push_back(new int(1)); });
  for (int* p : kept) delete p;
  ASSERT_EQ(n.size(), 3u);
  EXPECT_GE(n[1], 1);
  EXPECT_GE(n[2], 1);
}

}  // namespace
}  // namespace klein
