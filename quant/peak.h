#pragma once
// The ceiling of the integer kernels: how many multiply-adds per second the instruction each
// ISA's Q8/Q4 tiles are built on can do on this machine, measured with that instruction in a
// loop of independent accumulators that never touch memory. A matmul of that ISA cannot pass
// it; the fraction of it a denoising step reaches (`klein bench step`) says how much of the
// step is spent on anything else (unpacking, activations, attention, waiting).
//
//   scalar      no peak (0): the reference path
//   avx2        VPMADDUBSW twice, VPADDW, VPMADDWD, VPADDD: the Q4 tile's step, 64 byte products;
//               VPDPBUSD (ymm), 32, where the CPU has AVX-VNNI
//   avx512      VPDPBUSD (zmm): 64 byte products
//   amx         TDPBF16PS: a 16 x 32 by 32 x 16 bf16 tile product, 8192 products
//   neon        SDOT (v.4s, 16 bytes), or SMMLA where the CPU has I8MM (what the tiles use)
#include <cstdint>
#include <string_view>

#include "quant/matmul.h"

namespace klein {
class ThreadPool;
}

namespace klein::quant {

struct PeakRate {
  Isa isa = Isa::Scalar;
  std::string_view instruction;  // e.g. "vpdpbusd zmm"
  int threads = 0;
  double macs_per_second = 0;    // all threads together; 0 when the ISA has no integer kernel
};

// Runs the loop on every thread of `pool` at once for about `seconds` and returns the sum of
// their rates. `isa` must be available (isa_available) and not Auto.
PeakRate measure_peak(Isa isa, ThreadPool& pool, double seconds = 0.3);

namespace detail {
// One thread: `rounds` rounds of the ISA's loop; returns the multiply-adds done.
int64_t peak_loop_avx2(int64_t rounds);
int64_t peak_loop_avxvnni(int64_t rounds);
int64_t peak_loop_avx512(int64_t rounds);
int64_t peak_loop_amx(int64_t rounds);
int64_t peak_loop_neon(int64_t rounds);
int64_t peak_loop_neon_i8mm(int64_t rounds);
}  // namespace detail

}  // namespace klein::quant
