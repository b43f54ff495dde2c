#!/usr/bin/env bash
# Prints which instruction-set paths a test run exercised, from the lines the tests appended
# to LOG ("ran PATH Suite.Test" / "skipped PATH Suite.Test"; tests/support/isa.h).
#   scripts/isa-summary.sh LOG [PATHS...]   (default PATHS: those of this machine's architecture)
set -euo pipefail
log=$1
shift
if (($# > 0)); then
  paths=("$@")
elif [[ "$(uname -m)" == aarch64 || "$(uname -m)" == arm64 ]]; then
  paths=(scalar neon)
else
  paths=(scalar avx2 avx-vnni avx512 avx512-bf16 avx512-bf16-attention amx avx512-emulated
    amx-emulated)
fi
[[ -f "$log" ]] || : > "$log"
echo "Instruction-set paths in this run${KLEIN_ISA:+ (KLEIN_ISA=$KLEIN_ISA)}:"
for p in "${paths[@]}"; do
  ran=$(awk -v p="$p" '$1 == "ran" && $2 == p {print $3}' "$log" | sort -u | wc -l)
  skipped=$(awk -v p="$p" '$1 == "skipped" && $2 == p {print $3}' "$log" | sort -u | wc -l)
  if ((ran > 0)); then
    printf '  %-16s ran in %d test(s)\n' "$p" "$ran"
  elif ((skipped > 0)); then
    printf '  %-16s NOT RUN: this CPU lacks it (%d test(s) SKIPPED)\n' "$p" "$skipped"
  else
    printf '  %-16s NOT RUN: no test of it ran\n' "$p"
  fi
done
if [[ "$(uname -m)" != aarch64 && -z "${*:-}" ]]; then
  echo "  neon             not on this machine: CI runs it under qemu (.ci/run, ARM64 stage)"
fi
