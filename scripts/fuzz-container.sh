#!/usr/bin/env bash
# Builds the container parser fuzz target with clang (libFuzzer + AddressSanitizer +
# UndefinedBehaviorSanitizer) in the instrumented build tree and runs it for a bounded time.
# Usage: scripts/fuzz-container.sh [seconds, default 60] [extra libFuzzer args...]
# Environment: BUILD_DIR (default build-asan, the tree the sanitizer suite uses too:
# scripts/configure-sanitize.sh), CC/CXX (default clang/clang++).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-packages.sh clang  # libFuzzer comes with Debian's clang

seconds="${1:-60}"
shift || true
build="${BUILD_DIR:-build-asan}"

# The target (CMakeLists.txt, clang only) compiles the parsers' sources itself with
# -fsanitize=fuzzer; KLEIN_SANITIZE adds ASan and UBSan.
# FUZZ_BUILT=1: the targets are built already (scripts/fuzz-ci.sh builds them once for both).
if [[ "${FUZZ_BUILT:-0}" != 1 ]]; then
  bash scripts/configure-sanitize.sh "$build"
  cmake --build "$build" --target fuzz_container
fi

# Seed corpus: a well-formed header + index written from docs/container.md (two units, three
# tensors; the target re-seals the checksums, so none are computed here).
corpus="$build/fuzz-container-corpus"
mkdir -p "$corpus"
python3 - "$corpus/seed-valid" <<'PY'
import struct, sys
A = 65536
tensors = [  # name, type code, layout, block, dims, unit
    (b"transformer.transformer_blocks.0.attn.to_q.weight", 2, 0, 1, [256, 256], 0),
    (b"transformer.transformer_blocks.0.attn.norm_q.weight", 0, 0, 1, [128], 0),
    (b"vae.bn.running_mean", 0, 0, 1, [128], 1),
]
el = {0: 4, 1: 2, 2: 2}
units, recs, off, unit_off = [], [], A, {}
for u in (0, 1):
    off = (off + A - 1) // A * A
    start, first = off, sum(1 for t in tensors if t[5] < u)
    for name, code, layout, block, dims, tu in tensors:
        if tu != u:
            continue
        off = (off + 63) // 64 * 64
        n = 1
        for d in dims:
            n *= d
        size = n * el[code]
        recs.append(struct.pack("<H", len(name)) + name + struct.pack("<BBBBI", code, layout, len(dims), 0, block)
                    + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<QQQ", off, size, 0))
        off += size
    count = sum(1 for t in tensors if t[5] == u)
    uname = [b"transformer.double.0", b"vae.latent_stats"][u]
    units.append(struct.pack("<H", len(uname)) + uname + struct.pack("<IIQQQ", first, count, start, off - start, 0))
index = b"".join(units) + b"".join(recs)
data_end = off
file_size = data_end + len(index)
header = bytes([0x89]) + b"KLEIN\r\n" + struct.pack("<HHI", 1, 0, 128) + struct.pack(
    "<QQQQQQQQQQQQII", 0, file_size, A, 128, 0, 0, 0, data_end, len(index), 0, A, data_end - A,
    len(units), len(recs)) + struct.pack("<Q", 0)
assert len(header) == 128, len(header)
open(sys.argv[1], "wb").write(header + index)
PY

echo "== fuzz_container: ${seconds}s"
# The target's input files go to a folder of the build tree, not the system's temporary one.
mkdir -p "$build/fuzz-tmp"
TMPDIR="$(cd "$build/fuzz-tmp" && pwd)" "$build/fuzz_container" "$corpus" -max_total_time="$seconds" -max_len=4096 -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 "$@"
