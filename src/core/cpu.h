#pragma once
// What the CPU we run on can do, read once at start-up; kernels are chosen from this.
#include <string>

namespace klein {

struct CpuFeatures {
  bool avx2 = false;      // with FMA and F16C
  bool avx_vnni = false;  // VPDPBUSD on ymm (VEX): Alder Lake and later, Sapphire Rapids
  bool avx512 = false;    // F, BW, VL, DQ
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  // VDPBF16PS at a higher multiply-add rate than FMA: AMD's cores (Zen 4: twice the rate);
  // Intel's run it at a quarter of FMA's instruction rate (half its multiply-adds; measured
  // on Sapphire Rapids), so there the bf16 vector kernels are slower than the float32 ones.
  bool avx512_bf16_fast = false;
  // AMX tiles with BF16 dot products (Sapphire Rapids and later), enabled for this process
  // by the kernel (Linux asks each process to request the tile state first).
  bool amx_bf16 = false;
  bool neon = false;
  bool neon_dotprod = false;  // SDOT (FEAT_DotProd)
  bool neon_i8mm = false;     // SMMLA (FEAT_I8MM)
};

// The features of this CPU, limited by KLEIN_ISA (scalar, avx2, avx2-vnni, avx512, amx, neon,
// neon-dotprod) if set, so tests and benchmarks can force a path: avx2 is AVX2 without
// AVX-VNNI (the VPMADDUBSW tiles), avx2-vnni keeps it, both without AVX-512.
const CpuFeatures& cpu_features();
std::string describe(const CpuFeatures& f);

// The CPUs this process may use: those of its affinity mask, limited by the cgroup's CPU
// quota (cpu.max, rounded up) when there is one. At least 1. The default thread count.
int usable_cpus();
// The most worker threads a context accepts: far more is a mistake (each thread costs
// memory and scheduling, and the kernels split work by the thread count).
constexpr int kMaxThreads = 256;

}  // namespace klein
