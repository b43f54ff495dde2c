#!/usr/bin/env bash
# Runs the test suite on the build made by scripts/setup.sh.
#   scripts/test.sh              the Release build in ./build
#   scripts/test.sh --sanitize   builds ./build-asan with AddressSanitizer + UBSan and runs it there
# Golden data is read from ../shared/testdata (override with KLEIN_TESTDATA=DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

dir=build
if [[ "${1:-}" == "--sanitize" ]]; then
  dir=build-asan
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKLEIN_SANITIZE=ON \
        -DKLEIN_BUILD_BENCH=OFF >/dev/null
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fi
[[ -f "$dir/build.ninja" ]] || { echo "no build in ./$dir: run scripts/setup.sh first" >&2; exit 1; }
cmake --build "$dir"
ctest --test-dir "$dir" --output-on-failure --timeout 900 -j "$(nproc)"
