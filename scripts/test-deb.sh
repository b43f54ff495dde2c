#!/usr/bin/env bash
# Builds the Debian package (scripts/make-deb.sh), installs it with apt on this machine,
# checks the installed program, C library and Python package on the tiny model, and removes
# it again. Needs root or sudo (CI runs it on a fresh machine). The installed klein must make
# the build tree's image byte for byte, and klein_edge (found in /usr/lib/python3/dist-packages,
# its library through ld.so's cache) the same file again.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sudo_cmd=""
[[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
model="$(cd "${KLEIN_TESTDATA:-../shared/testdata}" && pwd)/klein-tiny/model"
# The trap is set before anything is made, so that an early failure leaves nothing behind.
installed=0
out=""
cleanup() {
  if ((installed)) && dpkg-query -W -f='${Status}' klein-edge 2>/dev/null | grep -q "install ok installed"; then
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get remove -y -qq klein-edge >/dev/null 2>&1 || true
  fi
  [[ -n "$out" ]] && rm -rf "$out"
  return 0
}
trap cleanup EXIT
out=$(mktemp -d "${TMPDIR:-/tmp}/klein-deb-test.XXXXXX")
deb=$(bash scripts/make-deb.sh "$build")
echo "package: $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -f "$deb" Depends

dpkg-query -W -f='${Status}' klein-edge 2>/dev/null | grep -q "install ok installed" &&
  { echo "klein-edge is installed already: remove it first" >&2; exit 1; }
installed=1
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "./$deb" >/dev/null

args=(generate -m "$model" -p "a small red cube" -W 64 -H 48 -s 2 --seed 3 --no-cache -q)
(cd / && /usr/bin/klein "${args[@]}" -o "$out/installed.png" >/dev/null)
"$build/klein" "${args[@]}" -o "$out/built.png" >/dev/null
cmp "$out/installed.png" "$out/built.png"
echo "installed klein: the build's image, byte for byte"

(cd / && env -u PYTHONPATH -u KLEIN_LIBRARY /usr/bin/python3 - "$model" "$out/python.png" <<'PY'
import sys, klein_edge
assert klein_edge.__file__.startswith("/usr/lib/python3/dist-packages/"), klein_edge.__file__
m = klein_edge.Model(sys.argv[1], threads=2)
image = m.generate("a small red cube", width=64, height=48, steps=2, seed=3)
klein_edge.save(image, sys.argv[2])
print("klein_edge", klein_edge.library_version(), "from", klein_edge.__file__)
PY
)
cmp "$out/python.png" "$out/built.png"
echo "installed Python package: the same file"

cc examples/c/generate.c $(pkg-config --cflags --libs klein) -o "$out/generate"
"$out/generate" "$model" "a small red cube" 3 64 48 2 "$out/c.png" 2>/dev/null
cmp "$out/c.png" "$out/built.png"
echo "examples/c/generate.c against the installed library and klein.pc: the same file"

DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get remove -y -qq klein-edge >/dev/null
[[ ! -e /usr/bin/klein && ! -e /usr/lib/libklein.so.0 ]] || { echo "files left after removal" >&2; exit 1; }
python3 -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("klein") is not None)' ||
  { echo "libklein still in ld.so's cache after removal" >&2; exit 1; }
echo "removed: no files left"
