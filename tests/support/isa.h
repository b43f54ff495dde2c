#pragma once
// Tests of the kernels that differ per instruction set, and a record of which paths a run
// exercised. A path this CPU (within KLEIN_ISA) cannot run is SKIPPED with the reason, never
// passed on a fallback; and when KLEIN_TEST_ISA_LOG names a file, every path a test ran or
// skipped is appended to it as one line ("ran avx2 Suite.Test" / "skipped amx Suite.Test"),
// which scripts/test.sh sums up at the end of the run. Header-only: the programs that include
// it link klein_quant already.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "core/cpu.h"
#include "quant/matmul.h"

namespace klein::quant {
// How GoogleTest names an instruction-set parameter in its output ("GetParam() = avx2").
inline void PrintTo(Isa isa, std::ostream* os) { *os << isa_name(isa); }
}  // namespace klein::quant

namespace klein::testing {

// One line appended to $KLEIN_TEST_ISA_LOG (a single write with O_APPEND, so the test programs
// ctest runs side by side do not interleave their lines).
inline void log_isa_path(const char* outcome, const std::string& path) {
  const char* file = std::getenv("KLEIN_TEST_ISA_LOG");
  if (file == nullptr || *file == '\0') return;
  const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string line = std::string(outcome) + " " + path + " " +
                           (t ? std::string(t->test_suite_name()) + "." + t->name() : "") + "\n";
  const int fd = ::open(file, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  [[maybe_unused]] const ssize_t n = ::write(fd, line.data(), line.size());
  ::close(fd);
}

// Every instruction set this build has kernels for, scalar first.
inline std::vector<quant::Isa> compiled_isas() {
#if defined(KLEIN_X86)
  return {quant::Isa::Scalar, quant::Isa::Avx2, quant::Isa::Avx512, quant::Isa::Amx};
#elif defined(KLEIN_ARM64)
  return {quant::Isa::Scalar, quant::Isa::Neon};
#else
  return {quant::Isa::Scalar};
#endif
}

inline std::string isa_skip_reason(quant::Isa isa) {
  return "SKIPPED: the " + std::string(quant::isa_name(isa)) +
         " path cannot run on this CPU (it has: " + describe(cpu_features()) +
         (std::getenv("KLEIN_ISA") ? std::string(", limited by KLEIN_ISA=") + std::getenv("KLEIN_ISA")
                                   : std::string()) +
         ")";
}

// True, and the path logged as run, when this CPU can run `isa`; else logged as skipped.
inline bool isa_runs(quant::Isa isa) {
  const bool ok = quant::isa_available(isa);
  log_isa_path(ok ? "ran" : "skipped", std::string(quant::isa_name(isa)));
  return ok;
}

// In a test body: the rest of the test needs `isa` (SKIPPED with the reason where it is
// missing). A check of the AMX tile path, say, says so instead of passing on the exact path.
#define KLEIN_REQUIRE_ISA(isa) \
  if (!::klein::testing::isa_runs(isa)) GTEST_SKIP() << ::klein::testing::isa_skip_reason(isa)

// A named path that is not one of quant::Isa (e.g. "avx512-bf16" for the bf16 direct
// convolution): logged, and the test SKIPPED with `why` where `available` is false.
#define KLEIN_REQUIRE_PATH(available, path, why)                          \
  ::klein::testing::log_isa_path((available) ? "ran" : "skipped", path); \
  if (!(available)) GTEST_SKIP() << "SKIPPED: " << why

// A test run once per compiled instruction set (TEST_P on a subclass, then
// KLEIN_INSTANTIATE_ON_EVERY_ISA(Subclass)): the ones this CPU lacks are SKIPPED with the
// reason, so a run on an AVX2 machine lists its AVX-512 and AMX cases as skipped.
class OnEveryIsa : public ::testing::TestWithParam<quant::Isa> {
 protected:
  void SetUp() override { KLEIN_REQUIRE_ISA(GetParam()); }
  quant::Isa isa() const { return GetParam(); }
};

inline std::string isa_param_name(const ::testing::TestParamInfo<quant::Isa>& info) {
  std::string name(quant::isa_name(info.param));
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

// For suites over (case name, ISA): "<case>_<isa>".
inline std::string case_isa_param_name(
    const ::testing::TestParamInfo<std::tuple<std::string, quant::Isa>>& info) {
  std::string isa(quant::isa_name(std::get<1>(info.param)));
  for (char& c : isa)
    if (c == '-') c = '_';
  return std::get<0>(info.param) + "_" + isa;
}

#define KLEIN_INSTANTIATE_ON_EVERY_ISA(suite)                                          \
  INSTANTIATE_TEST_SUITE_P(Isa, suite, ::testing::ValuesIn(::klein::testing::compiled_isas()), \
                           ::klein::testing::isa_param_name)

}  // namespace klein::testing
