#!/usr/bin/env bash
# The Debian package of a build: klein, libklein (shared and static), klein/klein.h,
# klein.pc, the CMake package and the Python package klein_edge, under /usr. Its Depends are
# the libraries the binaries link, as dpkg-shlibdeps finds them; the Python package
# recommends python3 and python3-pil. Installs with `apt install ./klein-edge_VERSION_ARCH.deb`.
#
#   scripts/make-deb.sh [BUILD_DIR]      (default ./build, made by scripts/setup.sh)
#
# Writes BUILD_DIR/klein-edge_VERSION_ARCH.deb for the build's architecture and prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[[ -f "$build/build.ninja" ]] || { echo "no build in ./$build: run scripts/setup.sh first" >&2; exit 1; }
bash scripts/install-packages.sh dpkg-dev  # dpkg-shlibdeps

version=$(sed -n 's/^project(klein VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d "${TMPDIR:-/tmp}/klein-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/root"

cmake --build "$build" >/dev/null
cmake --install "$build" --prefix "$root/usr" >/dev/null
python_dir="$root/usr/lib/python3/dist-packages/klein_edge"
install -d "$python_dir" "$root/usr/share/doc/klein-edge"
install -m 644 python/klein_edge/*.py "$python_dir/"
install -m 644 LICENSE "$root/usr/share/doc/klein-edge/copyright"

# dpkg-shlibdeps reads debian/control from the directory it runs in.
mkdir -p "$stage/src/debian"
printf 'Source: klein-edge\n\nPackage: klein-edge\nArchitecture: any\n' >"$stage/src/debian/control"
depends=$(cd "$stage/src" && dpkg-shlibdeps -O -e"$root/usr/bin/klein" \
  -e"$(readlink -f "$root/usr/lib/libklein.so")" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[[ -n "$depends" ]] || { echo "make-deb: dpkg-shlibdeps found no dependencies" >&2; exit 1; }

mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<CONTROL
Package: klein-edge
Version: $version
Architecture: $arch
Maintainer: Klein Edge <klein-edge@localhost>
Section: graphics
Priority: optional
Installed-Size: $(du -sk "$root/usr" | cut -f1)
Depends: $depends
Recommends: python3, python3-pil
Description: FLUX.2-klein and Z-Image image generation on the CPU
 klein converts FLUX.2-klein and Z-Image checkpoints into one container and generates
 images from it in a small fraction of the model's size in RAM; also a C library
 (libklein, klein/klein.h, klein.pc), an HTTP server (klein serve) and the Python
 package klein_edge.
CONTROL
# The shared library is found through ld.so's cache: refresh it after install and removal.
echo "activate-noawait ldconfig" >"$root/DEBIAN/triggers"
(cd "$root" && find usr -type f -exec md5sum {} + >DEBIAN/md5sums)

deb="$build/klein-edge_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
