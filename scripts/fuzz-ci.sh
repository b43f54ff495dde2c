#!/usr/bin/env bash
# CI's fuzzing: the container parser (scripts/fuzz-container.sh) beside the other parsers'
# targets (scripts/fuzz-parsers.sh, two at a time), all from the sanitizer tree, so that no
# core waits for the container fuzzer alone. Its log comes after the parsers'.
# Usage: scripts/fuzz-ci.sh [container seconds, default 30] [seconds per parser, default 25]
set -euo pipefail
cd "$(dirname "$0")/.."
container_seconds=${1:-30}
parser_seconds=${2:-25}
build="${BUILD_DIR:-build-asan}"
bash scripts/install-packages.sh clang python3
bash scripts/configure-sanitize.sh "$build"
# The parsers' targets as fuzz-parsers.sh lists them (one list: a target added there is built here).
read -ra parsers <<<"$(bash scripts/fuzz-parsers.sh --list)"
cmake --build "$build" --target fuzz_container "${parsers[@]/#/fuzz_}"
export FUZZ_BUILT=1
container_log="$build/fuzz-container-ci.log"
bash scripts/fuzz-container.sh "$container_seconds" >"$container_log" 2>&1 &
container=$!
rc=0
bash scripts/fuzz-parsers.sh "$parser_seconds" || rc=$?
container_rc=0
wait "$container" || container_rc=$?
cat "$container_log"
((container_rc == 0)) || { echo "fuzz_container failed (exit status $container_rc)"; rc=1; }
exit "$rc"
