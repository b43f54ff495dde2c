#!/usr/bin/env bash
# The arm64 Debian package, checked without an ARM machine. Cross-builds the engine, the CLI
# and the C library for aarch64 (scripts/configure-arm64.sh: Debian's arm64 libraries through
# multiarch), makes klein-edge_VERSION_arm64.deb (scripts/make-deb.sh), then:
#  1. apt resolves its Depends among Debian's arm64 packages (apt-get install --simulate here,
#     where dpkg has the arm64 architecture);
#  2. unpacked into a temporary root, its klein runs under qemu-aarch64 on Debian's arm64
#     loader and libraries: --version, inspect, and a generation of the tiny model that must
#     be byte for byte the native build's image (the exact path gives the same bytes on x86
#     and ARM);
#  3. examples/c/generate.c, cross-compiled against the package's header and klein.pc and
#     linked to its libklein.so.0, makes the same file under qemu (side by side with 2.);
#  4. its Python package, in Debian's arm64 Python (python3.11-minimal and its standard library,
#     fetched with apt-get download and unpacked, not installed), loads the package's library
#     under qemu and opens the model. (A generation from Python needs Pillow for arm64, which
#     is not fetched; the amd64 package's check generates from Python.)
# Needs root or sudo the first time (dpkg --add-architecture arm64, packages), and the native
# build for the reference image.
# Usage: scripts/test-deb-arm64.sh [arm64 build dir, default build-arm64] [native build, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-arm64}
native=${2:-build}
[[ -f "$native/CMakeCache.txt" ]] ||
  { echo "no native build in $native to compare with: run scripts/setup.sh first" >&2; exit 1; }
# The reference image must come from these sources: the native build of this checkout, brought
# up to date (another version of the engine may make other bytes).
source_dir=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$native/CMakeCache.txt")
[[ "$(realpath "$source_dir")" == "$(realpath .)" ]] ||
  { echo "$native is a build of $source_dir, not of this checkout ($PWD)" >&2; exit 1; }
cmake --build "$native" --target klein >/dev/null
model="$(cd "${KLEIN_TESTDATA:-../shared/testdata}" && pwd)/klein-tiny/model"

bash scripts/configure-arm64.sh "$build"
deb=$(bash scripts/make-deb.sh "$build")
echo "package: $deb ($(du -k "$deb" | cut -f1) KiB)"
[[ "$(dpkg-deb -f "$deb" Architecture)" == arm64 ]] ||
  { echo "$deb: Architecture is $(dpkg-deb -f "$deb" Architecture), not arm64" >&2; exit 1; }
dpkg-deb -f "$deb" Depends

# 1. What `apt install ./klein-edge_VERSION_arm64.deb` would do on an arm64 Debian: every
#    Depends must be an arm64 package apt can install (apt fails the simulation otherwise).
plan=$(apt-get install --simulate --no-install-recommends "$(realpath "$deb")" 2>&1) ||
  { echo "$plan" >&2; echo "apt cannot install $deb for arm64 (above)" >&2; exit 1; }
grep -q '^Inst klein-edge:arm64 ' <<<"$plan" ||
  { echo "$plan" >&2; echo "apt's plan does not install klein-edge:arm64" >&2; exit 1; }
echo "apt: the Depends resolve for arm64"

out=$(mktemp -d "${TMPDIR:-/tmp}/klein-deb-arm64.XXXXXX")
trap 'rm -rf "$out"' EXIT
root="$out/root"
dpkg-deb -x "$deb" "$root"
for f in "$root/usr/bin/klein" "$root/usr/lib/libklein.so.0" "$root/usr/lib/libklein.a" \
         "$root/usr/include/klein/klein.h" "$root/usr/lib/pkgconfig/klein.pc" \
         "$root/usr/lib/cmake/klein/kleinConfig.cmake"; do
  [[ -e "$f" ]] || { echo "the package has no ${f#"$root"}" >&2; exit 1; }
done
for f in python/klein_edge/*.py; do
  cmp "$f" "$root/usr/lib/python3/dist-packages/klein_edge/$(basename "$f")"
done

# 2. and 3. The CLI and the C library under qemu (qemu's default CPU model, `max`).
qemu-aarch64 "$root/usr/bin/klein" --version
inspect=$(qemu-aarch64 "$root/usr/bin/klein" inspect -m "$model")
grep -q 'family: FLUX.2-klein' <<<"$inspect" ||
  { echo "$inspect" >&2; echo "klein inspect under qemu did not describe the tiny model" >&2; exit 1; }
echo "klein --version and inspect under qemu: ran"
# The smallest generation that runs every stage: one step, 32x32 (about 45 s of CPU under qemu).
gen=("a small red cube" 3 32 32 1)
args=(generate -m "$model" -p "${gen[0]}" --seed "${gen[1]}" -W "${gen[2]}" -H "${gen[3]}"
      -s "${gen[4]}" --no-cache -q)
"$native/klein" "${args[@]}" -o "$out/native.png" >"$out/native.log" 2>&1 ||
  { cat "$out/native.log" >&2; echo "$native/klein generate failed" >&2; exit 1; }

cflags=$(PKG_CONFIG_LIBDIR="$root/usr/lib/pkgconfig" pkg-config --cflags --libs klein)
# shellcheck disable=SC2086  # flags, split on purpose
aarch64-linux-gnu-gcc examples/c/generate.c $cflags -o "$out/generate"
readelf -d "$out/generate" | grep -q 'Shared library: \[libklein.so.0\]' ||
  { echo "examples/c/generate.c did not link the package's libklein.so.0" >&2; exit 1; }

qemu-aarch64 "$root/usr/bin/klein" "${args[@]}" -o "$out/cli.png" >"$out/cli.log" 2>&1 &
cli=$!
c_rc=0
qemu-aarch64 -E LD_LIBRARY_PATH="$root/usr/lib" "$out/generate" "$model" "${gen[@]}" \
  "$out/c.png" >"$out/c.log" 2>&1 || c_rc=$?
cli_rc=0
wait "$cli" || cli_rc=$?
((cli_rc == 0)) || { cat "$out/cli.log" >&2; echo "klein generate under qemu failed" >&2; exit 1; }
((c_rc == 0)) || { cat "$out/c.log" >&2; echo "examples/c/generate.c under qemu failed" >&2; exit 1; }
cmp "$out/cli.png" "$out/native.png" ||
  { echo "the arm64 klein's image differs from the native build's" >&2; exit 1; }
echo "arm64 klein under qemu: the native build's image, byte for byte"
cmp "$out/c.png" "$out/native.png" ||
  { echo "the arm64 C library's image differs from the native build's" >&2; exit 1; }
echo "examples/c/generate.c on the package's libklein.so.0 under qemu: the same file"

# 4. The Python package in Debian's arm64 Python, unpacked next to the package.
python=(python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libexpat1)
(cd "$out" && apt-get -qq -o APT::Sandbox::User=root download "${python[@]/%/:arm64}")
for f in "$out"/*.deb; do dpkg-deb -x "$f" "$out/python"; done
(cd / && env -u PYTHONHOME PYTHONPATH="$root/usr/lib/python3/dist-packages" \
  KLEIN_LIBRARY="$root/usr/lib/libklein.so.0" \
  qemu-aarch64 -L "$out/python" "$out/python/usr/bin/python3.11" - "$root" "$model" <<'PY'
import platform, sys
import klein_edge
root, model = sys.argv[1], sys.argv[2]
assert platform.machine() == "aarch64", platform.machine()
assert klein_edge.__file__.startswith(root + "/usr/lib/python3/dist-packages/"), klein_edge.__file__
m = klein_edge.Model(model, threads=1)
m.close()
print("klein_edge", klein_edge.library_version(), "in Python", platform.python_version(),
      platform.machine())
PY
)
echo "the Python package under an arm64 Python: loads the package's library, opens the model"
