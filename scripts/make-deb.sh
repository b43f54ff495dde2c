#!/usr/bin/env bash
# The Debian package of a build: klein, libklein (shared and static), klein/klein.h,
# klein.pc, the CMake package and the Python package klein_edge, under /usr. Its Depends are
# the libraries the binaries link, as dpkg-shlibdeps finds them; the Python package
# recommends python3 and python3-pil. Installs with `apt install ./klein-edge_VERSION_ARCH.deb`.
#
#   scripts/make-deb.sh [BUILD_DIR]      (default ./build, made by scripts/setup.sh)
#   scripts/make-deb.sh build-arm64      (the arm64 package, from scripts/configure-arm64.sh's
#                                         cross build: the Depends name Debian's arm64 libraries)
#
# Writes BUILD_DIR/klein-edge_VERSION_ARCH.deb for the build's architecture (that of its
# compiler) and prints its path.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[[ -f "$build/build.ninja" ]] || { echo "no build in ./$build: run scripts/setup.sh first" >&2; exit 1; }
bash scripts/install-packages.sh dpkg-dev  # dpkg-shlibdeps

version=$(sed -n 's/^project(klein VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
# The Debian architecture the build's compiler makes code for (amd64, or arm64 when cross),
# from the compiler CMake found or was given (a toolchain file's is not in the cache).
cxx=$(sed -n 's/^set(CMAKE_CXX_COMPILER "\(.*\)")$/\1/p' "$build"/CMakeFiles/*/CMakeCXXCompiler.cmake |
  tail -n 1)
[[ -n "$cxx" ]] || { echo "make-deb: no C++ compiler recorded in $build/CMakeFiles" >&2; exit 1; }
target=$("$cxx" -dumpmachine)
arch=$(dpkg-architecture -t"$target" -qDEB_HOST_ARCH 2>/dev/null) ||
  { echo "make-deb: no Debian architecture for the compiler's target $target" >&2; exit 1; }
stage=$(mktemp -d "${TMPDIR:-/tmp}/klein-deb.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root="$stage/root"

# What is installed only (a cross build tree has no host test programs to build).
cmake --build "$build" --target klein klein_shared klein_static >/dev/null
cmake --install "$build" --prefix "$root/usr" >/dev/null
# The programs must be for that architecture (the control file would be wrong otherwise).
machine=$(readelf -h "$root/usr/bin/klein" | sed -n 's/^ *Machine: *//p')
case "$arch:$machine" in
  amd64:*X86-64 | arm64:AArch64) ;;
  *) echo "make-deb: $build/klein is for '$machine', not $arch" >&2; exit 1 ;;
esac
python_dir="$root/usr/lib/python3/dist-packages/klein_edge"
install -d "$python_dir" "$root/usr/share/doc/klein-edge"
install -m 644 python/klein_edge/*.py "$python_dir/"
install -m 644 LICENSE "$root/usr/share/doc/klein-edge/copyright"

# dpkg-shlibdeps reads debian/control from the directory it runs in. It takes the libraries
# of the programs' own ELF class and machine (the multiarch directories) and asks dpkg which
# package holds each, so for arm64 the libraries the build linked must be installed as
# Debian's :arm64 packages (scripts/configure-arm64.sh installs them).
mkdir -p "$stage/src/debian"
printf 'Source: klein-edge\n\nPackage: klein-edge\nArchitecture: any\n' >"$stage/src/debian/control"
if ! shlibs=$(cd "$stage/src" && DEB_HOST_ARCH=$arch dpkg-shlibdeps -O -e"$root/usr/bin/klein" \
    -e"$(readlink -f "$root/usr/lib/libklein.so")" 2>"$stage/shlibdeps.log"); then
  cat "$stage/shlibdeps.log" >&2
  echo "make-deb: dpkg-shlibdeps failed (above) for $arch" >&2
  exit 1
fi
depends=$(sed -n 's/^shlibs:Depends=//p' <<<"$shlibs")
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
