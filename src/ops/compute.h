#pragma once
// The compute context: everything an op needs besides its operands. One is created per
// session (a CLI run, a library session, a server worker) and passed explicitly to every op
// and kernel; nothing in the engine keeps mutable state anywhere else (no globals, no
// thread_local).
//
//   pool        the worker threads; the calling thread takes part as worker 0
//   isa         the instruction set the kernels use, resolved once (never Isa::Auto)
//   arithmetic  how activations are rounded in the network that is running: the pipeline
//               sets it from the precision (exact: float32 everywhere; fast: bf16 tiles where
//               the CPU has AMX) and restores it afterwards (Compute::Use)
//   arenas      one per worker, for the temporaries of a call (panels, attention tiles),
//               plus the matmul's buffer of quantized activations
//   cancel      a flag any thread may raise; long work checks it between layers, blocks and
//               steps and stops by throwing Cancelled
// A context is used by one calling thread at a time; its pool's workers only run the tasks
// that thread hands out. cancel() is the one call another thread may make.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "quant/matmul.h"

namespace klein {

// Memory for the temporaries of a call, taken and given back in stack order through Scope.
// Blocks are allocated only when the arena runs out, and when the outermost scope closes,
// several blocks are merged into one of their total size. So a sequence of calls that
// repeats, such as a denoising step, allocates during its first run only.
class Arena {
 public:
  Arena() = default;
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Makes sure `bytes` can be taken without allocating (e.g. from an activation plan).
  void reserve(size_t bytes);
  size_t capacity() const;
  size_t high_water() const { return high_water_; }  // most bytes in use at once so far

  // Everything taken through a scope is given back when it closes. Scopes nest.
  class Scope {
   public:
    explicit Scope(Arena& arena);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // n values of T, 64-byte aligned, uninitialised.
    template <class T>
    T* take(size_t n) {
      return static_cast<T*>(arena_.take_bytes(n * sizeof(T)));
    }

   private:
    Arena& arena_;
    size_t block_, used_, in_use_;
  };

 private:
  struct Block {
    std::byte* data = nullptr;
    size_t size = 0;
    size_t used = 0;
  };
  void* take_bytes(size_t bytes);
  void add_block(size_t bytes);
  void merge_blocks();

  std::vector<Block> blocks_;
  size_t current_ = 0;  // the block being filled
  size_t in_use_ = 0, high_water_ = 0;
  int depth_ = 0;
};

// How the activations of the running network are computed. All false: float32 everywhere
// (what the golden tests compare with the official pipeline). Each switch only has an effect
// on CPUs with AMX BF16 tiles, and bf16_attention also on AVX-512 BF16 without them
// (VDPBF16PS); elsewhere that part stays float32. fast_convolutions acts everywhere: bf16
// operands where the CPU multiplies them fast, Winograd F(4x4, 3x3) in float32 elsewhere.
struct Arithmetic {
  bool bf16_attention = false;     // Q·Kᵀ and P·V on bf16 operands (ops::attention)
  bool float_on_tiles = false;     // F32/BF16/F16 weights: projections on bf16 tiles (ops::linear)
  bool fast_convolutions = false;  // VAE convolutions: bf16 operands or Winograd (ops::conv2d)

  static Arithmetic exact() { return {}; }
  static Arithmetic fast() { return {true, true, true}; }
  bool any() const { return bf16_attention || float_on_tiles || fast_convolutions; }
};

// Thrown by Compute::stop_if_cancelled(): the work was cancelled, nothing was produced.
class Cancelled : public Error {
 public:
  Cancelled() : Error("cancelled") {}
};

class Compute {
 public:
  // threads <= 0: one per usable CPU (core/cpu.h). isa Auto: the best the CPU has within KLEIN_ISA;
  // another value forces that path and fails if the CPU or build lacks it.
  explicit Compute(int threads = 0, quant::Isa isa = quant::Isa::Auto);
  Compute(const Compute&) = delete;
  Compute& operator=(const Compute&) = delete;

  ThreadPool& pool() { return pool_; }
  int threads() const { return pool_.size(); }
  quant::Isa isa() const { return isa_; }
  bool amx() const { return isa_ == quant::Isa::Amx; }
  bool avx512() const { return isa_ == quant::Isa::Avx512 || isa_ == quant::Isa::Amx; }

  Arithmetic arithmetic;

  // The arena of a pool worker (0 = the calling thread).
  Arena& arena(int worker) { return *arenas_[size_t(worker)]; }
  // Gives every worker's arena room for the most any of them has held at once so far; call
  // while no task runs (between steps). Which worker takes which task of a loop depends on
  // timing, so otherwise a worker could meet a loop's largest task only in a later step and
  // allocate there.
  void level_arenas();
  // Options for quant::matmul: this context's ISA and activation buffer.
  quant::MatmulOptions matmul_options();

  // Asks the running work to stop (from any thread); it throws Cancelled at its next check.
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }
  void clear_cancel() { cancelled_.store(false, std::memory_order_relaxed); }
  void stop_if_cancelled() const {
    if (cancelled()) throw Cancelled();
  }

  // Progress inside one network's run (its layers or blocks), reported by the model as it
  // goes; the caller decides what it means (pipeline stages turn it into Progress::step).
  using StepReport = std::function<void(int64_t done, int64_t total)>;
  void report_step(int64_t done, int64_t total) const {
    if (step_report_) step_report_(done, total);
  }
  // Sets the step report while it lives and restores the previous one.
  class Reporting {
   public:
    Reporting(Compute& cx, StepReport r) : cx_(cx), previous_(std::move(cx.step_report_)) {
      cx.step_report_ = std::move(r);
    }
    ~Reporting() { cx_.step_report_ = std::move(previous_); }
    Reporting(const Reporting&) = delete;
    Reporting& operator=(const Reporting&) = delete;

   private:
    Compute& cx_;
    StepReport previous_;
  };

  // Sets the arithmetic while it lives and restores the previous one.
  class Use {
   public:
    Use(Compute& cx, Arithmetic a) : cx_(cx), previous_(cx.arithmetic) { cx.arithmetic = a; }
    ~Use() { cx_.arithmetic = previous_; }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    Compute& cx_;
    Arithmetic previous_;
  };

 private:
  ThreadPool pool_;
  quant::Isa isa_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  quant::MatmulScratch matmul_scratch_;
  std::atomic<bool> cancelled_{false};
  StepReport step_report_;
};

}  // namespace klein
