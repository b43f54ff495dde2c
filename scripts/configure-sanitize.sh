#!/usr/bin/env bash
# Configures the one instrumented build tree (default ./build-asan) that the sanitizer suite
# (scripts/test.sh --sanitize) and the fuzzers (scripts/fuzz-container.sh,
# scripts/fuzz-parsers.sh) share: clang, AddressSanitizer + UBSan on everything, libFuzzer's
# coverage on the parsers (KLEIN_FUZZ), no benchmarks. Sharing it compiles the engine once
# for both stages instead of twice. Line tables only for the debug information: enough for
# file:line in every sanitizer and fuzzer report, and much less to compile and link
# (docs/TESTING.md).
# Usage: scripts/configure-sanitize.sh [build dir]   Environment: CC/CXX (default clang),
# KLEIN_SANITIZE_OPT (the optimisation level, default -O2).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-packages.sh clang  # libFuzzer and the sanitizer runtimes come with it
build=${1:-build-asan}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="${CC:-clang}" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="${KLEIN_SANITIZE_OPT:--O2} -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="${KLEIN_SANITIZE_OPT:--O2} -gline-tables-only -DNDEBUG" \
  -DKLEIN_SANITIZE=ON -DKLEIN_FUZZ=ON -DKLEIN_BUILD_BENCH=OFF >/dev/null
