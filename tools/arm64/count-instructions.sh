#!/usr/bin/env bash
# Instructions per multiply-accumulate of the aarch64 integer matmul kernels, counted under
# qemu (a proxy for speed while no ARM machine is at hand: it counts instructions, not cycles).
# For each kernel variant (KLEIN_ISA=neon: widening multiplies; a Cortex-A76 model: SDOT;
# qemu's max model: SMMLA) and weight type, matmul_loop runs with 1 and 3 repetitions under
# `qemu-aarch64 -singlestep -d exec,nochain`, which logs one line per executed instruction;
# the difference is two whole matmul calls (activation quantization, tiling, the tiles), so
# start-up and set-up cancel out. A second shape with twice the columns isolates the tiles.
# Needs the cross build of scripts/cross-test-arm64.sh.
# Usage: tools/arm64/count-instructions.sh [build dir, default build-arm64] [M K]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-arm64}
M=${2:-16}
K=${3:-1024}
sysroot=/usr/aarch64-linux-gnu

cmake --build "$build" --target klein_quant klein_core >/dev/null
aarch64-linux-gnu-g++ -std=c++20 -O2 -I . -I src tools/arm64/matmul_loop.cpp \
  "$build/libklein_quant.a" "$build/libklein_core.a" -o "$build/matmul_loop"

count() {  # cpu isa type N reps -> executed instructions
  KLEIN_ISA=$2 qemu-aarch64 -cpu "$1" -L "$sysroot" -singlestep -d exec,nochain -D /dev/stderr \
    "$build/matmul_loop" "$3" "$M" "$4" "$K" "$5" 2>&1 >/dev/null | grep -c '^Trace'
}

echo "| variant | type | per MAC, whole call (M=$M, N=256, K=$K) | per MAC, tiles only (N 256 -> 512) |"
echo "| --- | --- | ---: | ---: |"
for variant in "neon max widening" "native cortex-a76 sdot" "native max smmla"; do
  read -r isa cpu name <<<"$variant"
  for type in q8 q4; do
    one=$(count "$cpu" "$isa" "$type" 256 1)
    three=$(count "$cpu" "$isa" "$type" 256 3)
    wide=$(count "$cpu" "$isa" "$type" 512 3)
    wide_one=$(count "$cpu" "$isa" "$type" 512 1)
    awk -v n="$name" -v t="$type" -v a="$one" -v b="$three" -v c="$wide_one" -v d="$wide" \
      -v m="$M" -v k="$K" 'BEGIN {
        call = (b - a) / 2 / (m * 256 * k)
        tiles = ((d - c) - (b - a)) / 2 / (m * 256 * k)
        printf "| %s | %s | %.4f | %.4f |\n", n, t, call, tiles }'
  done
done
