#include "core/cpu.h"

#include <sched.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <string_view>

#if defined(KLEIN_X86)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif
#if defined(KLEIN_ARM64) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace klein {
namespace {

#if defined(KLEIN_X86)
// AMX needs three things: the CPU's AMX-TILE and AMX-BF16 bits, the OS saving the tile state
// (XCR0 bits 17 and 18), and on Linux a per-process request for that state, without which
// the first tile instruction faults.
bool enable_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if (((lo >> 17) & 3) != 3) return false;
#if defined(__linux__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return ::syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(KLEIN_X86)
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know it.
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1);
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  // AVX-VNNI: CPUID leaf 7, sub-leaf 1, EAX bit 4 (GCC 12's __builtin_cpu_supports lacks it).
  f.avx_vnni = f.avx2 && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1);
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
  unsigned vendor[3] = {};
  __get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]);  // EBX, EDX, ECX spell the vendor
  f.avx512_bf16_fast = f.avx512_bf16 && std::memcmp(vendor, "AuthenticAMD", 12) == 0;
  f.amx_bf16 = f.avx512_vnni && f.avx512_bf16 && enable_amx_bf16();
#elif defined(KLEIN_ARM64)
  f.neon = true;
#if defined(__linux__) && defined(HWCAP_ASIMDDP)
  f.neon_dotprod = (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
#if defined(__linux__)
  // HWCAP2_I8MM (bit 13) is missing from older kernel headers.
  constexpr unsigned long kHwcap2I8mm = 1ul << 13;
  f.neon_i8mm = f.neon_dotprod && (getauxval(AT_HWCAP2) & kHwcap2I8mm) != 0;
#endif
#endif
  return f;
}

// KLEIN_ISA lowers what we use, never raises it above what the CPU has.
CpuFeatures apply_limit(CpuFeatures f, std::string_view isa) {
  if (isa.empty() || isa == "native") return f;
  if (isa == "scalar") return CpuFeatures{};
  if (isa == "avx2" || isa == "avx2-vnni") {
    f.avx512 = f.avx512_vnni = f.avx512_bf16 = f.avx512_bf16_fast = f.amx_bf16 = false;
    if (isa == "avx2") f.avx_vnni = false;
  } else if (isa == "avx512") {
    f.amx_bf16 = false;
  } else if (isa == "amx") {
    // everything the CPU has
  } else if (isa == "neon") {
    f.neon_dotprod = f.neon_i8mm = false;
  } else if (isa == "neon-dotprod") {
    f.neon_i8mm = false;
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    const char* isa = std::getenv("KLEIN_ISA");
    return apply_limit(detect(), isa ? std::string_view(isa) : std::string_view());
  }();
  return features;
}

std::string describe(const CpuFeatures& f) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(f.avx2, "avx2");
  add(f.avx_vnni, "avx-vnni");
  add(f.avx512, "avx512");
  add(f.avx512_vnni, "avx512-vnni");
  add(f.avx512_bf16, "avx512-bf16");
  add(f.avx512_bf16_fast, "avx512-bf16-fast");
  add(f.amx_bf16, "amx-bf16");
  add(f.neon, "neon");
  add(f.neon_dotprod, "neon-dotprod");
  add(f.neon_i8mm, "neon-i8mm");
  return s.empty() ? "scalar" : s;
}

int usable_cpus() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = int(std::thread::hardware_concurrency());
  // cgroup v2: "max 100000" (no limit) or "<quota> <period>" in microseconds.
  std::ifstream max_file("/sys/fs/cgroup/cpu.max");
  std::string quota;
  long long period = 0;
  if (max_file >> quota >> period && quota != "max" && period > 0) {
    const long long q = std::atoll(quota.c_str());
    if (q > 0) n = std::min<int>(n, int(std::max<long long>(1, (q + period - 1) / period)));
  }
  return std::max(1, n);
}

}  // namespace klein
