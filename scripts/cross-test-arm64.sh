#!/usr/bin/env bash
# Cross-builds klein_quant and its test program for aarch64 and runs the tests under qemu:
# all of them on qemu's `max` CPU model (SDOT and SMMLA: the SMMLA tiles), and the matmul
# tests again on a Cortex-A76 model (SDOT, no SMMLA) and with KLEIN_ISA=neon (neither), the
# three runs side by side.
# Installs what it needs when missing: g++-aarch64-linux-gnu, qemu-user, libgtest-dev (whose
# sources in /usr/src/googletest are built here for aarch64).
# Usage: scripts/cross-test-arm64.sh [build dir, default build-arm64]
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-arm64}
mkdir -p "$build"
build=$(cd "$build" && pwd)  # absolute: the install prefix below must not land in the tree

# The cross compiler and qemu, from Debian's packages, if this machine lacks them.
bash scripts/install-packages.sh g++-aarch64-linux-gnu qemu-user libgtest-dev
sysroot=/usr/aarch64-linux-gnu
toolchain=(
  -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
  -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++
  "-DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64;-L;$sysroot"
)

# 1. GoogleTest (and GoogleMock, which other test programs link) for aarch64, from the sources
#    Debian ships with libgtest-dev.
cmake -S /usr/src/googletest -B "$build/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  "${toolchain[@]}" -DBUILD_GMOCK=ON -DCMAKE_INSTALL_PREFIX="$build/googletest-install" \
  >/dev/null
cmake --build "$build/googletest" --target install >/dev/null

# 2. klein_quant and test_quant only (the other libraries' host dependencies are never built).
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${toolchain[@]}" \
  -DKLEIN_BUILD_BENCH=OFF -DGTest_DIR="$build/googletest-install/lib/cmake/GTest" >/dev/null
cmake --build "$build" --target test_quant

# 3. Run under qemu. KLEIN_EXPECT_CPU makes the test program check that each run detects the
#    features (and so runs the kernel variant) it is meant to. The three runs go side by side
#    (qemu runs one guest thread at a time here, so two cores take two runs); each log is
#    printed whole, in this order, when all have finished.
run() {
  local log=$1 cpu=$2 expect=$3
  shift 3
  local rc=0
  KLEIN_EXPECT_CPU=$expect qemu-aarch64 -cpu "$cpu" -L "$sysroot" "$build/tests/test_quant" \
    --gtest_brief=1 "$@" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}
# Not the scalar instances of the two largest matmul tests: each NEON instance runs the scalar
# path beside it through the same checks (against the reference bound, and the padding left
# alone), so on qemu, where the two instances take the same 40 seconds, the scalar one would
# only repeat that work. The other runs: the NEON cases only.
everything='--gtest_filter=-*MatmulTest.LargestK/scalar:*MatmulTest.LargeShapesCrossTileAndChunkBoundaries/scalar'
matmul_tests='--gtest_filter=*MatmulTest.*/neon:*ActivationQuantization.*:Isa.*'
export KLEIN_TEST_ISA_LOG="$build/isa-paths.log"
rm -f "$KLEIN_TEST_ISA_LOG" "$build"/qemu-*.log*
run "$build/qemu-max.log" max "neon neon-dotprod neon-i8mm" "$everything" &
run "$build/qemu-cortex-a76.log" cortex-a76 "neon neon-dotprod" "$matmul_tests" &
KLEIN_ISA=neon run "$build/qemu-neon.log" max "neon" "$matmul_tests" &
wait
failed=0
for name in max cortex-a76 neon; do
  echo "== qemu: $name"
  cat "$build/qemu-$name.log"
  [[ "$(cat "$build/qemu-$name.log.rc")" == 0 ]] || { echo "== qemu: $name FAILED"; failed=1; }
done
bash scripts/isa-summary.sh "$KLEIN_TEST_ISA_LOG" scalar neon
exit "$failed"
