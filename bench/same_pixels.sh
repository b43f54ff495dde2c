#!/usr/bin/env bash
# Do two builds of klein make the same pixels? Runs `klein generate` with both binaries on
# the same model, prompt, seed and size, for every instruction set this CPU has (KLEIN_ISA)
# and both precisions, and compares the decoded pixels byte for byte (the image metadata
# names the program version, so files are compared through their pixels, not their bytes).
# Used to show that a refactoring changed no output.
#
#   bench/same_pixels.sh OLD_KLEIN NEW_KLEIN MODEL [generate options...]
#   bench/same_pixels.sh /tmp/old/klein build/klein ../shared/testdata/klein-tiny/model -W 64 -H 48
#
# Needs python3 with the standard library only (PNG decoding by zlib).
set -euo pipefail
old=$1 new=$2 model=$3
shift 3
out=$(mktemp -d)
isas=(scalar)
grep -qw avx2 /proc/cpuinfo && isas+=(avx2)
grep -qw avx512f /proc/cpuinfo && isas+=(avx512)
grep -qw amx_bf16 /proc/cpuinfo && isas+=(amx)
pixels() {  # the raw decompressed IDAT of a PNG: equal iff the pixels (and filters) are equal
  python3 - "$1" <<'PY'
import struct, sys, zlib, hashlib
data = open(sys.argv[1], 'rb').read()
pos, idat = 8, b''
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    if kind == b'IDAT': idat += data[pos + 8:pos + 8 + n]
    pos += 12 + n
print(hashlib.sha256(zlib.decompress(idat)).hexdigest())
PY
}
status=0
for isa in "${isas[@]}"; do
  for precision in exact fast; do
    for which in old new; do
      bin=$old; [[ $which == new ]] && bin=$new
      KLEIN_ISA=$isa "$bin" generate -m "$model" -p "a red fox in fresh snow" --seed 7 -q \
        --no-cache --precision "$precision" "$@" -o "$out/$which-$isa-$precision.png" >/dev/null
    done
    a=$(pixels "$out/old-$isa-$precision.png") b=$(pixels "$out/new-$isa-$precision.png")
    if [[ $a == "$b" ]]; then verdict=same; else verdict=DIFFERENT; status=1; fi
    echo "$isa $precision: $verdict ($a)"
  done
done
rm -rf "$out"
exit $status
