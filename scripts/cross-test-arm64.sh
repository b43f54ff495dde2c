#!/usr/bin/env bash
# Cross-builds the test programs of the kernels and of the float math around them for aarch64
# and runs them under qemu:
# - test_quant (the integer kernels): all of it on qemu's `max` CPU model (SDOT and SMMLA: the
#   SMMLA tiles), and the matmul tests again on a Cortex-A76 model (SDOT, no SMMLA) and with
#   KLEIN_ISA=neon (neither);
# - test_ops on `max`: the NEON float GEMM, the Winograd transforms, activations, attention
#   (the NEON GEMM with the portable softmax), norms, against their definitions and the
#   portable code;
# - a part of test_vae and of test_flux2 on `max`: the convolutions, GroupNorm and the tiny VAE
#   and transformer against the official outputs (the models' math as aarch64 builds it).
# All runs side by side.
# Configures the cross build with scripts/configure-arm64.sh (Debian's cross compiler, qemu-user,
# Debian's arm64 libraries and GoogleTest through multiarch), builds these targets only.
# Usage: scripts/cross-test-arm64.sh [build dir, default build-arm64]
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build-arm64}
bash scripts/configure-arm64.sh "$build"
cmake --build "$build" --target test_quant test_ops test_vae test_flux2

# Run under qemu. KLEIN_EXPECT_CPU makes the test program check that each run detects the
# features (and so runs the kernel variant) it is meant to (test_quant reads it). The runs go
# side by side (the tests run one thread at a time under qemu, so two cores take two runs);
# each log is printed whole, in this order, when all have finished.
run() {
  local log=$1 program=$2 cpu=$3 expect=$4
  shift 4
  local rc=0
  KLEIN_EXPECT_CPU=$expect qemu-aarch64 -cpu "$cpu" "$build/tests/$program" \
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
# Of test_vae and test_flux2, what runs the math on small inputs (under qemu the whole of the
# two programs takes more than 20 minutes): the convolutions and GroupNorm against their
# definitions, the tiny VAE against the official intermediates (exact and Winograd), the tiny
# transformer's forward against the official one, with and without a reference image. Left
# out: the real-shape VAE tests, the banded whole-image comparisons and the sampler's four-step
# runs (each 25 s or more under qemu; the same code as the forward).
vae_tests='--gtest_filter=Conv2d.*:GroupNorm.*:Isa/GroupNormRows.*:VaeGolden.*:VaeLatents.*:-VaeGolden.BandedDecodeMatchesWholeImage'
flux2_tests='--gtest_filter=TransformerTest.TextToImage64x64MatchesEveryIntermediate:TransformerTest.OneReferenceMatchesOnTheTargetRows:TransformerTest.RopeTablesMatch:TransformerTest.TimestepEmbeddingAndModulationMatch:TransformerTest.ContextEmbedderMatches'
export KLEIN_TEST_ISA_LOG="$build/isa-paths.log"
rm -f "$KLEIN_TEST_ISA_LOG" "$build"/qemu-*.log*
runs=(max cortex-a76 neon ops vae flux2)
run "$build/qemu-max.log" test_quant max "neon neon-dotprod neon-i8mm" "$everything" &
run "$build/qemu-cortex-a76.log" test_quant cortex-a76 "neon neon-dotprod" "$matmul_tests" &
KLEIN_ISA=neon run "$build/qemu-neon.log" test_quant max "neon" "$matmul_tests" &
run "$build/qemu-ops.log" test_ops max "" &
run "$build/qemu-vae.log" test_vae max "" "$vae_tests" &
run "$build/qemu-flux2.log" test_flux2 max "" "$flux2_tests" &
wait
failed=0
for name in "${runs[@]}"; do
  echo "== qemu: $name"
  cat "$build/qemu-$name.log"
  [[ "$(cat "$build/qemu-$name.log.rc")" == 0 ]] || { echo "== qemu: $name FAILED"; failed=1; }
done
bash scripts/isa-summary.sh "$KLEIN_TEST_ISA_LOG" scalar neon
exit "$failed"
