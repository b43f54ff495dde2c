#!/usr/bin/env bash
# Cross-builds klein_quant and its test program for aarch64 and runs the tests under qemu:
# all of them on qemu's `max` CPU model (SDOT and SMMLA: the SMMLA tiles), and the matmul
# tests again on a Cortex-A76 model (SDOT, no SMMLA) and with KLEIN_ISA=neon (neither), the
# three runs side by side.
# Configures the cross build with scripts/configure-arm64.sh (Debian's cross compiler, qemu-user,
# Debian's arm64 libraries and GoogleTest through multiarch), builds the two targets only.
# Usage: scripts/cross-test-arm64.sh [build dir, default build-arm64]
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-arm64}
bash scripts/configure-arm64.sh "$build"
cmake --build "$build" --target test_quant

# Run under qemu. KLEIN_EXPECT_CPU makes the test program check that each run detects the
# features (and so runs the kernel variant) it is meant to. The three runs go side by side
# (qemu runs one guest thread at a time here, so two cores take two runs); each log is
# printed whole, in this order, when all have finished.
run() {
  local log=$1 cpu=$2 expect=$3
  shift 3
  local rc=0
  KLEIN_EXPECT_CPU=$expect qemu-aarch64 -cpu "$cpu" "$build/tests/test_quant" \
    --gtest_brief=1 "$@" >"$log" 2>&1 || rc=$?
  echo "$rc" >"$log.rc"
}
# Not the scalar instances of the two largest matmul tests: each NEON instance runs the scalar
# path beside it through the same checks (against the reference bound, and the padding left
# alone), so on qemu, where the two instances take the same 40 seconds, the scalar one would
# only repeat that work. Nor the peak's timing test (PeakIsa): it compares the rate of the
# SDOT/SMMLA loop with the Q4 kernel's, which under an emulator says nothing about either (the
# loops are built, and the peak's refusals run). The other runs: the NEON cases only.
everything='--gtest_filter=-*MatmulTest.LargestK/scalar:*MatmulTest.LargeShapesCrossTileAndChunkBoundaries/scalar:*PeakIsa.*'
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
