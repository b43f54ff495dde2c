// Matrix bookkeeping (sizes, slices, packing) and the matmul driver: it cuts Y into
// cache-sized tasks, hands them to the thread pool and calls the kernels of the chosen
// instruction set (quant/kernels.h) on each piece.
#include "quant/matmul.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <vector>

#include "core/cpu.h"
#include "core/error.h"
#include "quant/blocks.h"
#include "quant/kernels.h"
#include "quant/types.h"

namespace klein::quant {
namespace {

using detail::ActBlocks;
using detail::Kernels;

// ---- Tuning (measured on a 2-core AVX-512 machine; see BENCHMARKS.md) ----------------------
// Below this M the float types use dot products along K on the row-major weights; from it
// on, converting 32-row panels pays for itself.
constexpr int64_t kIntKcBlocks = 64;     // 32-column blocks per chunk of K (2048 columns)
constexpr int64_t kIntMaxRows = 384;     // int8 activation block: 384 x 2 KiB (L2)
constexpr int64_t kIntSubGroups = 16;    // weight groups whose Y block stays in L2: 384 x 256

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What differs between the storage types comes from their table (quant/types.h).
bool is_float(DType t) {
  const StorageType* s = find_storage_type(t);
  return s && !s->quantized;
}

size_t block_bytes(DType t) { return storage_type(t).block_bytes; }
size_t tile_bytes(DType t) { return storage_type(t).tile_bytes; }

void check_shape(DType type, Layout layout, int64_t rows, int64_t cols) {
  check(rows >= 0 && cols >= 0, "matrix: negative shape [", rows, ", ", cols, "]");
  if (is_float(type)) {
    check(layout == Layout::RowMajor, "matrix: ", dtype_name(type), " supports only the RowMajor",
          " layout, not ", layout_name(layout));
  } else {
    check(is_storage_type(type), "matrix: ", dtype_name(type), " is not a weight type");
    check(cols % kBlock == 0, "matrix: ", dtype_name(type), " needs a column count that is a",
          " multiple of ", kBlock, ", got ", cols);
  }
}

// ---- Instruction sets ----------------------------------------------------------------------

const Kernels& kernels_for(Isa isa) {
  if (isa == Isa::Auto) isa = best_isa();
  check(isa_available(isa), "matmul: instruction set ", isa_name(isa),
        " is not available on this CPU or build");
  switch (isa) {
#if defined(KLEIN_X86)
    case Isa::Avx2: return detail::avx2_kernels();
    case Isa::Amx: {
      static const Kernels amx = [] {
        Kernels k = detail::avx512_kernels();
        k.isa = Isa::Amx;
        return k;
      }();
      return amx;
    }
    case Isa::Avx512: {
      // AVX-512 without VNNI (first-generation AVX-512 CPUs): AVX-512 float kernels with the
      // AVX2 integer ones.
      if (cpu_features().avx512_vnni) return detail::avx512_kernels();
      static const Kernels mixed = [] {
        Kernels k = detail::avx512_kernels();
        const Kernels& a = detail::avx2_kernels();
        k.int_rows = a.int_rows;  // the activation layout follows the integer kernels
        k.quantize_rows = a.quantize_rows;
        k.tiles_q8 = a.tiles_q8;
        k.tiles_q4 = a.tiles_q4;
        return k;
      }();
      return mixed;
    }
#endif
#if defined(KLEIN_ARM64)
    case Isa::Neon: return detail::neon_kernels();
#endif
    default: return detail::scalar_kernels();
  }
}

// ---- Task split ----------------------------------------------------------------------------

int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Y is cut into m_blocks x n_chunks tasks; a task covers rows [i * m_block, ...) and `units`
// (n-tiles of the kernel) [j * n_chunk, ...). A few tasks per thread, so that dynamic hand-out
// evens out a core that is busy with something else. Rows are split only as far as the
// activation block of a task must fit in L2 (max_rows): every extra row block converts or
// streams all of W once more, while an extra column chunk only repacks X rows, which is
// cheaper when N >= M. Only when the columns run out are the rows split further.
struct Split {
  int64_t m_block, m_blocks, n_chunk, n_chunks;
  int64_t tasks() const { return m_blocks * n_chunks; }
};

Split split_work(int64_t M, int64_t units, int threads, int64_t m_align, int64_t max_rows) {
  const int64_t wanted = threads > 1 ? 3 * threads : 1;
  Split s;
  s.m_blocks = ceil_div(M, max_rows);
  s.n_chunks = std::min(units, ceil_div(wanted, s.m_blocks));
  if (s.m_blocks * s.n_chunks < wanted)
    s.m_blocks = std::max(s.m_blocks, std::min(ceil_div(M, m_align), ceil_div(wanted, s.n_chunks)));
  s.m_block = round_up(ceil_div(M, s.m_blocks), m_align);
  s.m_blocks = ceil_div(M, s.m_block);
  s.n_chunk = ceil_div(units, s.n_chunks);
  s.n_chunks = ceil_div(units, s.n_chunk);
  return s;
}

// A per-worker piece of one buffer, so tasks never allocate.
template <class T>
class WorkerBuffers {
 public:
  // `shared` more elements after the workers' pieces, for all of them (shared()).
  WorkerBuffers(MatmulScratch* scratch, int workers, size_t per_worker, size_t shared = 0)
      : per_worker_((per_worker * sizeof(T) + 63) / 64 * 64 / sizeof(T)), workers_(workers) {
    MatmulScratch& s = scratch ? *scratch : local_;
    base_ = static_cast<T*>(s.get((per_worker_ * size_t(workers) + shared) * sizeof(T)));
  }
  T* operator[](int worker) const { return base_ + per_worker_ * size_t(worker); }
  T* shared() const { return base_ + per_worker_ * size_t(workers_); }

 private:
  MatmulScratch local_;
  size_t per_worker_;
  int workers_;
  T* base_ = nullptr;
};

// ---- Quantized weights (Q8 / Q4) -----------------------------------------------------------

// Where the tiles of group g, blocks [b0, b0 + count) come from: straight from an
// Interleaved16 matrix, or re-laid out from RowMajor blocks into a per-task buffer.
class TileSource {
 public:
  TileSource(const Matrix& w) : w_(w), nb_(w.cols / kBlock), tile_(tile_bytes(w.type)) {
    if (w.layout == Layout::RowMajor) buffer_.resize(size_t(kIntKcBlocks) * tile_);
  }

  const void* tiles(int64_t g, int64_t b0, int64_t count) {
    const auto* base = static_cast<const uint8_t*>(w_.data);
    if (w_.layout == Layout::Interleaved16) return base + size_t(g * nb_ + b0) * tile_;
    const size_t row_bytes = size_t(nb_) * block_bytes(w_.type);
    for (int64_t b = 0; b < count; ++b) {
      const void* rows[kTileRows];
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t n = g * kTileRows + r;
        rows[r] = n < w_.rows ? base + size_t(n) * row_bytes + size_t(b0 + b) * block_bytes(w_.type)
                              : nullptr;
      }
      storage_type(w_.type).make_tile(rows, buffer_.data() + size_t(b) * tile_);
    }
    return buffer_.data();
  }

 private:
  const Matrix& w_;
  int64_t nb_;
  size_t tile_;
  std::vector<uint8_t> buffer_;
};

void matmul_quantized(const Kernels& kern, const float* x, int64_t M, int64_t ldx, const Matrix& w,
                      float* y, int64_t ldy, ThreadPool& pool, MatmulScratch* scratch) {
  const int64_t N = w.rows, K = w.cols, nb = K / kBlock;
  const int mr = kern.int_rows;
  const StorageType& st = storage_type(w.type);

  // 1. Activations to int8 blocks, once, shared by all threads.
  const size_t entries = size_t(round_up(M, mr) * nb);
  const size_t q_bytes = entries * kBlock;
  const size_t s_bytes = (entries * 4 + 63) / 64 * 64;
  MatmulScratch local;
  auto* buf = static_cast<uint8_t*>((scratch ? scratch : &local)->get(q_bytes + 3 * s_bytes));
  ActBlocks act;
  act.q = reinterpret_cast<int8_t*>(buf);
  act.scale = reinterpret_cast<float*>(buf + q_bytes);
  act.scaled_sum = reinterpret_cast<float*>(buf + q_bytes + s_bytes);
  act.neg128_sum = reinterpret_cast<int32_t*>(buf + q_bytes + 2 * s_bytes);
  act.blocks_per_row = nb;
  act.tile_rows = mr;
  pool.parallel_for(
      M, [&](int64_t m0, int64_t m1, int) { kern.quantize_rows(x, ldx, m0, m1, K, act); }, 16);

  // 2. Integer tiles: each task takes rows [m0, m1) of the activations and a run of 16-row
  // weight groups. A few groups at a time, with K inside in chunks: the activation chunk
  // stays in L2, and so does the block of Y that every chunk adds into.
  const int64_t groups = ceil_div(N, kTileRows);
  const Split s = split_work(M, groups, pool.size(), mr, kIntMaxRows);
  pool.for_each_task(s.tasks(), [&](int64_t task, int) {
    const int64_t m0 = (task / s.n_chunks) * s.m_block, m1 = std::min(M, m0 + s.m_block);
    const int64_t g0 = (task % s.n_chunks) * s.n_chunk, g1 = std::min(groups, g0 + s.n_chunk);
    TileSource source(w);
    for (int64_t gs = g0; gs < g1; gs += kIntSubGroups) {
      for (int64_t b0 = 0; b0 < nb; b0 += kIntKcBlocks) {
        const int64_t count = std::min(kIntKcBlocks, nb - b0);
        for (int64_t g = gs; g < std::min(g1, gs + kIntSubGroups); ++g) {
          const void* tiles = source.tiles(g, b0, count);
          const int cols = int(std::min<int64_t>(kTileRows, N - g * kTileRows));
          for (int64_t m = m0; m < m1; m += mr) {
            const int rows = int(std::min<int64_t>(mr, m1 - m));
            float* yt = y + m * ldy + g * kTileRows;
            st.tiles(kern, act, m, b0, rows, tiles, count, yt, ldy, cols, b0 > 0);
          }
        }
      }
    }
  });
}

#if defined(KLEIN_X86)
// ---- AMX tiles (Q8 / Q4, BF16, and float weights with float_on_tiles) ----------------------

// Rows [n0, n0 + 16), blocks [b0, b0 + count) of a row-major F32 / BF16 / F16 matrix as B
// tiles (one per 32 columns, pair layout: tile row p holds (w[r][32b + 2p], w[r][32b + 2p + 1])
// for r = 0..15), rows past the matrix zero. `rows_bf16` holds 16 x 32 count bf16 (F32 / F16).
void float_rows_to_tiles(const Matrix& w, int64_t n0, int64_t b0, int64_t count,
                         uint16_t* rows_bf16, uint16_t* out) {
  const int64_t K = w.cols, kc = count * kBlock;
  const int rows = int(std::clamp<int64_t>(w.rows - n0, 0, kTileRows));
  const auto* base =
      static_cast<const uint8_t*>(w.data) + size_t(n0 * K + b0 * kBlock) * dtype_size(w.type);
  const uint8_t* pairs;  // row r, pair q of the chunk: 4 bytes at pairs + 4 (r * ld / 2 + q)
  int64_t ld = K;
  if (w.type == DType::BF16) {
    pairs = base;
  } else {
    float row[kBlock];
    for (int r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < count; ++b) {
        to_f32(w.type, base + size_t(r * K + b * kBlock) * dtype_size(w.type), row, kBlock);
        f32_to_bf16(row, rows_bf16 + r * kc + b * kBlock, kBlock);
      }
    }
    pairs = reinterpret_cast<const uint8_t*>(rows_bf16);
    ld = kc;
  }
  // Weights from a file may sit at any even address: copy the pairs bytewise-safe.
  auto* tiles = reinterpret_cast<uint8_t*>(out);
  for (int64_t b = 0; b < count; ++b, tiles += detail::kAmxTileElements * sizeof(uint16_t)) {
    for (int p = 0; p < kBlock / 2; ++p) {
      for (int r = 0; r < kTileRows; ++r) {
        uint8_t* dst = tiles + 4 * (p * kTileRows + r);
        if (r < rows) {
          std::memcpy(dst, pairs + 4 * (r * (ld / 2) + b * (kBlock / 2) + p), 4);
        } else {
          std::memset(dst, 0, 4);
        }
      }
    }
  }
}

// How matmul_amx cuts the work. A task takes a panel of 16-row weight groups and a range of
// rows of X, and makes the panel's B tiles once per chunk of K; they stay in L2 while every
// 32-row block of X streams past. Two shapes of plan, measured at M 768 / 4608 on the model's
// shapes (BENCHMARKS.md "Matmul kernels"):
// - Short K (one bf16 part, K <= 3072): narrow panels (1 MiB of B tiles, 10-12 groups; 4-5 %
//   less matmul time in a step than 512 KiB since the B tiles are made beside the products)
//   over the whole of K, X converted to bf16 once for all tasks, and each 32-row block's sums kept
//   in a small buffer that stays in L1 until they go to Y. 10-20% faster than the wide plan
//   at K = 3072.
// - Long K, or three parts: K in chunks (512 columns for one part, 1024 for three) with Y as
//   the accumulator, so that the panels can be wide however long K is. X as one bf16 part is
//   converted once for all panels where that copy is at most MatmulOptions::
//   amx_shared_x_bytes (0.88-0.93 of the time of the step's K = 9216 / 12288 products against
//   converting it per panel); otherwise, and for three parts (6 bytes per value), each panel
//   converts each 32-row block into a per-worker buffer that stays in L1. At K = 12288 this
//   plan is 1.3-1.5x the narrow one. Panels of 640 KiB for one part
//   (10-12% faster than 1.25 MiB at M 256-768 in a step, the same at 4608: the panel, X's
//   chunk and Y's block share L2), 1.25 MiB for three (smaller ones convert X's three parts
//   more often: 9% slower at 640 KiB).
struct AmxPlan {
  int splits;     // bf16 parts per activation: 1 (rounded) or 3 (exact)
  bool narrow;    // the short-K plan above
  int64_t chunk;  // 32-column blocks per chunk of K
  int64_t sub;    // blocks per micro-kernel call: the X piece it reads again for every group pair
  int64_t panel;  // weight groups per task (even, except a last odd one)
};

// The narrowest panel matmul_amx makes to give every thread work (16 groups, 256 columns);
// below it, tasks split the rows. Measured on one core with the tasks of 8 and 16 threads
// (the K = 9216 / 12288 products of a klein-4B step were split into 5-10 row ranges, each
// making the same B tiles: 2.4x and 3.8x the weights converted per step): 0.95 and 0.91 of
// the matmul time; 8 groups did better at 16 threads (0.87) and worse at 8 (0.98).
constexpr int64_t kMinSplitPanel = 16;

AmxPlan amx_plan(int64_t nb, int64_t groups, int splits) {
  const int64_t tile_bytes = int64_t(detail::kAmxTileElements * sizeof(uint16_t));
  auto groups_in = [&](int64_t bytes, int64_t chunk) {
    return std::min(groups, std::max<int64_t>(2, bytes / (chunk * tile_bytes) / 2 * 2));
  };
  AmxPlan plan;
  plan.splits = splits;
  plan.narrow = splits == 1 && nb <= 96;
  if (plan.narrow) {
    plan.chunk = nb;
    plan.sub = 8;
    plan.panel = groups_in(1024 * 1024, nb);
    return plan;
  }
  const int64_t max_chunk = splits == 1 ? 16 : 32;
  plan.chunk = ceil_div(nb, ceil_div(nb, max_chunk));
  plan.sub = splits == 1 ? std::min<int64_t>(8, plan.chunk) : plan.chunk;
  plan.panel = groups_in((splits == 1 ? 640 : 1280) * 1024, plan.chunk);
  return plan;
}

// Weight groups [g0, g1), 32-column blocks [c0, c0 + count) as B tiles: group g at tiles + (g -
// g0) * count tiles. `row_buffer`: 16 x 32 count bf16, for F32 / F16 weights.
void panel_to_tiles(const detail::AmxKernels& amx, const Matrix& w, TileSource& source,
                    int64_t g0, int64_t g1, int64_t c0, int64_t count, uint16_t* row_buffer,
                    uint16_t* tiles) {
  constexpr int64_t kTile = int64_t(detail::kAmxTileElements);
  for (int64_t g = g0; g < g1; ++g) {
    uint16_t* out = tiles + (g - g0) * count * kTile;
    if (is_float(w.type)) {
      float_rows_to_tiles(w, g * kTileRows, c0, count, row_buffer, out);
      continue;
    }
    for (int64_t b = 0; b < count; b += kIntKcBlocks) {  // what TileSource re-lays out at once
      const int64_t n = std::min(kIntKcBlocks, count - b);
      storage_type(w.type).tiles_to_bf16(amx, source.tiles(g, c0 + b, n), n, out + b * kTile);
    }
  }
}

// Where a panel's B tiles come from when the micro-kernel makes them as it goes (quantized
// weights in the Interleaved16 layout, whose tiles of group g0 + g lie at group0 + g * stride).
struct PanelSource {
  void (*convert)(const detail::AmxKernels& amx, const void* tiles, int64_t count,
                  uint16_t* out);
  size_t tile_bytes;
  const uint8_t* group0;  // group g0's tile at the chunk's first block
  size_t stride;          // bytes from one group's tiles to the next
};

// The side work of one micro-kernel call (quant/kernels.h AmxSideWork): the B tiles of the next
// call, one piece per tile, in two runs of consecutive tiles (the two groups of a pair).
struct CallWork {
  const detail::AmxKernels* amx;
  const PanelSource* make;
  const uint8_t* src[2];
  uint16_t* out[2];
  int64_t run_tiles = 0, tiles = 0;  // tiles per run, in all

  static constexpr int64_t kAhead = 6;  // tiles whose weights are asked for before their turn

  const uint8_t* source(int64_t t) const {
    return src[t / run_tiles] + size_t(t % run_tiles) * make->tile_bytes;
  }
  void fetch(int64_t t) const {
    const uint8_t* p = source(t);
    for (size_t o = 0; o < make->tile_bytes; o += 64)
      __builtin_prefetch(p + o, 0, 3);
  }
  static void run(const void* context, int64_t piece) {
    const auto& w = *static_cast<const CallWork*>(context);
    if (piece + kAhead < w.tiles) w.fetch(piece + kAhead);
    w.make->convert(*w.amx, w.source(piece), 1,
                    w.out[piece / w.run_tiles] +
                        (piece % w.run_tiles) * int64_t(detail::kAmxTileElements));
  }
};

// out[32 x 16 groups] = (c if `accumulate`) + the 32 rows of X at `a` (bf16 parts, rows lda
// apart) times the panel's B tiles (`groups` groups of `count` tiles), group pair by group
// pair, with c (rows ldc apart) holding the sums between sub-chunks and the last sub-chunk
// writing out (rows ldo apart; it may be c). The loop over the pairs is innermost, so a
// sub-chunk of X is read from L1 / L2 once and serves the whole panel.
// With `make`, the B tiles are not there yet: each micro-kernel call makes those of the next
// call while the tile unit multiplies (the first call's are made first).
void multiply_block_by_panel(const detail::AmxKernels& amx, const AmxPlan& plan,
                             const uint16_t* a, int64_t lda, uint16_t* tiles, int64_t groups,
                             int64_t count, float* c, int64_t ldc, bool accumulate, float* out,
                             int64_t ldo, const PanelSource* make) {
  constexpr int64_t kTile = int64_t(detail::kAmxTileElements);
  const int64_t pairs = ceil_div(groups, 2), calls = ceil_div(count, plan.sub) * pairs;
  // The side work of call `i` (sub-chunk s0, pair g): the tiles of the call after it.
  auto work_for = [&](int64_t i, int64_t s0, int64_t g) {
    CallWork w{&amx, make, {}, {}};
    if (make && i + 1 < calls) {
      const int64_t ns0 = g + 2 < groups ? s0 : s0 + plan.sub, ng = g + 2 < groups ? g + 2 : 0;
      const int runs = int(std::min<int64_t>(2, groups - ng));
      w.run_tiles = std::min(plan.sub, count - ns0);
      w.tiles = runs * w.run_tiles;
      for (int r = 0; r < runs; ++r) {
        w.src[r] = make->group0 + size_t(ng + r) * make->stride + size_t(ns0) * make->tile_bytes;
        w.out[r] = tiles + ((ng + r) * count + ns0) * kTile;
      }
      for (int64_t t = 0; t < std::min(CallWork::kAhead, w.tiles); ++t) w.fetch(t);
    }
    return w;
  };
  if (make) {
    const int runs = int(std::min<int64_t>(2, groups));
    const int64_t n = std::min(plan.sub, count);
    for (int r = 0; r < runs; ++r)
      make->convert(amx, make->group0 + size_t(r) * make->stride, n, tiles + r * count * kTile);
  }
  int64_t i = 0;
  for (int64_t s0 = 0; s0 < count; s0 += plan.sub) {
    const int64_t sub = std::min(plan.sub, count - s0);
    const bool last = s0 + sub == count;
    for (int64_t g = 0; g < groups; g += 2, ++i) {
      const int pair = int(std::min<int64_t>(2, groups - g));
      const uint16_t* b0 = tiles + (g * count + s0) * kTile;
      const CallWork work = work_for(i, s0, g);
      const detail::AmxSideWork side{CallWork::run, &work, work.tiles};
      amx.block(a + s0 * kBlock, lda, plan.splits, b0, b0 + count * kTile, pair, sub,
                accumulate || s0 > 0 ? c + g * kTileRows : nullptr, ldc,
                last ? out + g * kTileRows : c + g * kTileRows, last ? ldo : ldc,
                work.tiles > 0 ? &side : nullptr);
    }
  }
}

void matmul_amx(const float* x, int64_t M, int64_t ldx, const Matrix& w, float* y, int64_t ldy,
                ThreadPool& pool, MatmulScratch* scratch, int splits, size_t shared_x_limit) {
  const detail::AmxKernels& amx = detail::amx_kernels();
  const int64_t N = w.rows, K = w.cols, nb = K / kBlock;
  constexpr int64_t kRows = detail::kAmxBlockRows;
  constexpr int64_t kTile = int64_t(detail::kAmxTileElements);
  const int64_t groups = ceil_div(N, kTileRows);
  AmxPlan plan = amx_plan(nb, groups, splits);
  // Work for every thread: columns first (narrower panels, down to kMinSplitPanel groups),
  // then rows. Each task that splits the rows of a panel makes that panel's B tiles again.
  const int64_t wanted = pool.size() > 1 ? 3 * pool.size() : 1;
  if (ceil_div(groups, plan.panel) < wanted)
    plan.panel = std::min(plan.panel,
                          std::max(kMinSplitPanel, round_up(ceil_div(groups, wanted), 2)));
  const int64_t panels = ceil_div(groups, plan.panel);
  // Still few panels (small N, or many threads): split the rows too.
  const int64_t row_blocks = ceil_div(M, kRows);
  const int64_t m_splits = std::min(row_blocks, std::max<int64_t>(1, ceil_div(wanted, panels)));
  const int64_t m_split = ceil_div(row_blocks, m_splits) * kRows;

  // X as bf16 for all tasks, converted once: rows one 64-byte line longer than K, so that the
  // 32 rows of a block fall in different L1 sets (at K = 3072 a row is 6 KiB, and rows 4 KiB
  // apart, or 12, share their sets: 16 rows of a 12-way cache would evict each other). Always
  // in the narrow plan; in the wide one for one bf16 part where the copy stays small (the MLP's
  // down projections, whose rows come in chunks of at most 543), else each task converts each
  // 32-row block of each chunk of K, once per panel.
  const int64_t ldxb = K + 32;
  const size_t x_bytes = size_t(row_blocks * kRows * ldxb) * sizeof(uint16_t);
  const bool shared_x = plan.narrow || (splits == 1 && x_bytes <= shared_x_limit);

  // Per worker: the panel's B tiles for one chunk, one 32-row block of X as bf16 parts (X not
  // shared), (F32 / F16) one group of weight rows as bf16, and the sums of a block that stays
  // in L1 (narrow plan) or overhangs Y.
  const int64_t kc = plan.chunk * kBlock;
  const bool convert_rows = w.type == DType::F32 || w.type == DType::F16;
  const size_t panel_elements = size_t(plan.panel * plan.chunk * kTile);
  const size_t a_elements = shared_x ? 0 : size_t(splits * kRows * kc);
  const size_t row_elements = convert_rows ? size_t(kTileRows * kc) : 0;
  const size_t edge_floats = size_t(kRows * plan.panel * kTileRows);
  const size_t per_worker = (panel_elements + a_elements + row_elements) * sizeof(uint16_t) +
                            edge_floats * sizeof(float);
  WorkerBuffers<uint8_t> buffers(scratch, pool.size(), per_worker, shared_x ? x_bytes : 0);
  auto* xb = reinterpret_cast<uint16_t*>(buffers.shared());
  if (shared_x) {
    pool.parallel_for(row_blocks, [&](int64_t b0, int64_t b1, int) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t m = b * kRows;
        amx.rows_to_bf16(x + m * ldx, ldx, int(std::min<int64_t>(kRows, M - m)), int(K), 1,
                         xb + m * ldxb, ldxb);
      }
    });
  }

  pool.for_each_task(panels * m_splits, [&](int64_t task, int worker) {
    auto* tiles = reinterpret_cast<uint16_t*>(buffers[worker]);
    uint16_t* a = tiles + panel_elements;
    uint16_t* row_buffer = a + a_elements;
    auto* edge = reinterpret_cast<float*>(row_buffer + row_elements);
    const int64_t g0 = (task / m_splits) * plan.panel, g1 = std::min(groups, g0 + plan.panel);
    const int64_t m0 = (task % m_splits) * m_split, m1 = std::min(M, m0 + m_split);
    const int64_t n0 = g0 * kTileRows, panel_cols = (g1 - g0) * kTileRows;
    const int cols = int(std::min<int64_t>(panel_cols, N - n0));
    TileSource source(w);
    // Quantized weights in tiles already: the first row block's micro-kernel calls make the B
    // tiles as they go. Others (float weights, row-major blocks) are made here first.
    const bool make_on_the_way = !is_float(w.type) && w.layout == Layout::Interleaved16;
    for (int64_t c0 = 0; c0 < nb; c0 += plan.chunk) {
      const int64_t count = std::min(plan.chunk, nb - c0);
      PanelSource make{};
      if (make_on_the_way) {
        const size_t tile = tile_bytes(w.type);
        make = {storage_type(w.type).tiles_to_bf16, tile,
                static_cast<const uint8_t*>(w.data) + size_t(g0 * nb + c0) * tile,
                size_t(nb) * tile};
      } else {
        panel_to_tiles(amx, w, source, g0, g1, c0, count, row_buffer, tiles);
      }
      amx.configure();
      for (int64_t m = m0; m < m1; m += kRows) {
        const int rows = int(std::min<int64_t>(kRows, m1 - m));
        const uint16_t* ax = shared_x ? xb + m * ldxb + c0 * kBlock : a;
        const int64_t lda = shared_x ? ldxb : count * kBlock;
        if (!shared_x)
          amx.rows_to_bf16(x + m * ldx + c0 * kBlock, ldx, rows, int(count * kBlock), splits, a,
                           lda);
        // Full blocks go to Y: in the wide plan Y holds the sums throughout; in the narrow one
        // they stay in `edge` (in L1) between sub-chunks and the last one writes Y. A block
        // that overhangs M or N goes through `edge` only.
        const bool full = rows == kRows && cols == panel_cols;
        const bool inside = !plan.narrow && full;
        float* c = inside ? y + m * ldy + n0 : edge;
        const int64_t ldc = inside ? ldy : panel_cols;
        if (!full && c0 > 0) {
          for (int r = 0; r < rows; ++r)
            std::memcpy(edge + r * panel_cols, y + (m + r) * ldy + n0, size_t(cols) * 4);
        }
        float* out = full ? y + m * ldy + n0 : edge;
        const int64_t ldo = full ? ldy : panel_cols;
        multiply_block_by_panel(amx, plan, ax, lda, tiles, g1 - g0, count, c, ldc, c0 > 0, out,
                                ldo, make_on_the_way && m == m0 ? &make : nullptr);
        if (!full) {
          for (int r = 0; r < rows; ++r)
            std::memcpy(y + (m + r) * ldy + n0, edge + r * panel_cols, size_t(cols) * 4);
        }
      }
      amx.release();
    }
  });
}
#endif

}  // namespace

// ---- Layouts and sizes ---------------------------------------------------------------------

std::string_view layout_name(Layout layout) {
  switch (layout) {
    case Layout::RowMajor: return "RowMajor";
    case Layout::Interleaved16: return "Interleaved16";
  }
  return "?";
}

int64_t row_granularity(Layout layout) { return layout == Layout::Interleaved16 ? kTileRows : 1; }

size_t storage_bytes(DType type, Layout layout, int64_t rows, int64_t cols) {
  check_shape(type, layout, rows, cols);
  if (is_float(type)) return size_t(rows * cols) * dtype_size(type);
  const int64_t nb = cols / kBlock;
  if (layout == Layout::RowMajor) return size_t(rows * nb) * block_bytes(type);
  return size_t(ceil_div(rows, kTileRows) * nb) * tile_bytes(type);
}

Matrix Matrix::slice_rows(int64_t begin, int64_t end) const {
  const int64_t g = row_granularity(layout);
  check(0 <= begin && begin <= end && end <= rows, "matrix: row slice [", begin, ", ", end,
        ") outside [0, ", rows, ")");
  check(begin % g == 0 && (end % g == 0 || end == rows), "matrix: row slice [", begin, ", ", end,
        ") of a ", layout_name(layout), " ", dtype_name(type), " matrix must start and end at",
        " multiples of ", g, " rows");
  Matrix m = *this;
  m.rows = end - begin;
  const size_t offset = storage_bytes(type, layout, begin, cols);
  m.data = static_cast<const uint8_t*>(data) + offset;
  m.nbytes = storage_bytes(type, layout, m.rows, cols);
  return m;
}

void pack(const float* w, int64_t rows, int64_t cols, DType type, Layout layout, void* out) {
  check_shape(type, layout, rows, cols);
  auto* dst = static_cast<uint8_t*>(out);
  const StorageType& st = storage_type(type);
  if (!st.quantized) return st.quantize(w, dst, rows * cols);
  const int64_t nb = cols / kBlock;
  const size_t row_bytes = size_t(nb) * st.block_bytes;
  auto quantize_row = [&](const float* src, void* blocks) { st.quantize(src, blocks, cols); };
  if (layout == Layout::RowMajor) {
    for (int64_t r = 0; r < rows; ++r) quantize_row(w + r * cols, dst + size_t(r) * row_bytes);
    return;
  }
  // Interleaved16: quantize 16 rows, then deal their blocks out into tiles.
  std::vector<uint8_t> group(kTileRows * row_bytes);
  for (int64_t g = 0; g < ceil_div(rows, kTileRows); ++g) {
    const void* row_blocks[kTileRows];
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t n = g * kTileRows + r;
      row_blocks[r] = nullptr;
      if (n >= rows) continue;
      quantize_row(w + n * cols, group.data() + r * row_bytes);
      row_blocks[r] = group.data() + r * row_bytes;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const void* rb[kTileRows];
      for (int r = 0; r < kTileRows; ++r)
        rb[r] = row_blocks[r] ? static_cast<const uint8_t*>(row_blocks[r]) + b * block_bytes(type)
                              : nullptr;
      st.make_tile(rb, dst + size_t(g * nb + b) * st.tile_bytes);
    }
  }
}

void pack_blocks(const void* blocks, int64_t rows, int64_t cols, DType type, Layout layout, void* out) {
  check_shape(type, layout, rows, cols);
  const StorageType& st = storage_type(type);
  check(st.quantized, "pack_blocks: ", dtype_name(type), " is not a block type");
  const int64_t nb = cols / kBlock;
  const size_t row_bytes = size_t(nb) * st.block_bytes;
  const auto* src = static_cast<const uint8_t*>(blocks);
  auto* dst = static_cast<uint8_t*>(out);
  if (layout == Layout::RowMajor) {
    std::memcpy(dst, src, size_t(rows) * row_bytes);
    return;
  }
  for (int64_t g = 0; g < ceil_div(rows, kTileRows); ++g)
    for (int64_t b = 0; b < nb; ++b) {
      const void* rb[kTileRows];
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t n = g * kTileRows + r;
        rb[r] = n < rows ? src + size_t(n) * row_bytes + size_t(b) * st.block_bytes : nullptr;
      }
      st.make_tile(rb, dst + size_t(g * nb + b) * st.tile_bytes);
    }
}

void unpack_rows(const Matrix& w, int64_t r0, int64_t r1, float* out) {
  check_shape(w.type, w.layout, w.rows, w.cols);
  check(0 <= r0 && r0 <= r1 && r1 <= w.rows, "unpack_rows: rows [", r0, ", ", r1,
        ") outside [0, ", w.rows, ")");
  const int64_t K = w.cols;
  const auto* base = static_cast<const uint8_t*>(w.data);
  const StorageType& st = storage_type(w.type);
  if (!st.quantized) return st.dequantize(base + size_t(r0 * K) * st.block_bytes, out, (r1 - r0) * K);
  const int64_t nb = K / kBlock;
  for (int64_t r = r0; r < r1; ++r) {
    float* dst = out + (r - r0) * K;
    if (w.layout == Layout::RowMajor) {
      st.dequantize(base + size_t(r * nb) * st.block_bytes, dst, K);
      continue;
    }
    const int64_t g = r / kTileRows;
    const int rr = int(r % kTileRows);
    alignas(16) std::byte block[64];  // one block of any quantized type
    for (int64_t b = 0; b < nb; ++b) {
      st.tile_row(base + size_t(g * nb + b) * st.tile_bytes, rr, block);
      st.dequantize(block, dst + b * kBlock, kBlock);
    }
  }
}

Layout preferred_layout(DType type) {
  return storage_type(type).quantized ? Layout::Interleaved16 : Layout::RowMajor;
}

// ---- Instruction sets ----------------------------------------------------------------------

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Auto: return "auto";
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Amx: return "amx";
    case Isa::Neon: return "neon";
  }
  return "?";
}

bool isa_available(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::Auto:
    case Isa::Scalar: return true;
#if defined(KLEIN_X86)
    case Isa::Avx2: return f.avx2;
    case Isa::Avx512: return f.avx512;
    case Isa::Amx: return f.amx_bf16;
#endif
#if defined(KLEIN_ARM64)
    case Isa::Neon: return f.neon;
#endif
    default: return false;
  }
}

Isa best_isa() {
  const std::vector<Isa> isas = available_isas();
  return isas.back();
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon})
    if (isa_available(isa)) out.push_back(isa);
  return out;
}

// ---- Scratch -------------------------------------------------------------------------------

MatmulScratch::MatmulScratch() = default;
MatmulScratch::~MatmulScratch() = default;

void MatmulScratch::Free::operator()(void* p) const { std::free(p); }

void* MatmulScratch::get(size_t bytes) {
  if (bytes > capacity_ || !data_) {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    data_.reset();
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    data_.reset(p);
    capacity_ = rounded;
  }
  return data_.get();
}

// ---- Entry points --------------------------------------------------------------------------

void matmul(const float* x, int64_t M, int64_t ldx, const Matrix& w, float* y, int64_t ldy,
            ThreadPool& pool, const MatmulOptions& options) {
  check_shape(w.type, w.layout, w.rows, w.cols);
  const int64_t N = w.rows, K = w.cols;
  check(M >= 0 && ldx >= K && ldy >= N, "matmul: bad strides (M ", M, ", ldx ", ldx, ", ldy ",
        ldy, ") for a [", N, ", ", K, "] weight");
  check(w.nbytes >= storage_bytes(w.type, w.layout, N, K), "matmul: ", dtype_name(w.type), " ",
        layout_name(w.layout), " weight [", N, ", ", K, "] needs ",
        storage_bytes(w.type, w.layout, N, K), " bytes, has ", w.nbytes);
  check(K % kBlock == 0, "matmul: K = ", K, " is not a multiple of ", kBlock);
  const Kernels& kern = kernels_for(options.isa);
  if (M == 0 || N == 0) return;
#if defined(KLEIN_X86)
  if (runs_on_tiles(w, M, options)) {
    // BF16 weights keep their float32 activations exactly, in three bf16 parts; everything
    // else on tiles has them rounded to bf16.
    const bool exact = w.type == DType::BF16 && !options.float_on_tiles;
    return matmul_amx(x, M, ldx, w, y, ldy, pool, options.scratch,
                      exact ? detail::kAmxMaxSplits : 1, options.amx_shared_x_bytes);
  }
#endif
  check(!is_float(w.type), "matmul: ", dtype_name(w.type), " weights are multiplied here only on "
        "AMX tiles (M >= ", detail::kAmxMinRows, "); elsewhere ops::linear runs them through "
        "OpenBLAS");
  matmul_quantized(kern, x, M, ldx, w, y, ldy, pool, options.scratch);
}

bool runs_on_tiles(const Matrix& w, int64_t M, const MatmulOptions& options) {
  const Isa isa = options.isa == Isa::Auto ? best_isa() : options.isa;
  if (isa != Isa::Amx || !isa_available(isa)) return false;
  if (M < detail::kAmxMinRows || w.cols % kBlock != 0) return false;
  if (is_float(w.type)) return w.type == DType::BF16 || options.float_on_tiles;
  return true;
}

void matmul_reference(const float* x, int64_t M, int64_t ldx, const Matrix& w, float* y,
                      int64_t ldy) {
  const int64_t K = w.cols;
  std::vector<float> row(size_t(K > 0 ? K : 1));
  for (int64_t n = 0; n < w.rows; ++n) {
    unpack_rows(w, n, n + 1, row.data());
    for (int64_t m = 0; m < M; ++m) y[m * ldy + n] = float(dot_f32(row.data(), x + m * ldx, K));
  }
}

}  // namespace klein::quant
