#!/usr/bin/env bash
# Configures the aarch64 cross build tree (default ./build-arm64) with
# cmake/aarch64-linux-gnu.cmake: Debian's cross compiler, and Debian's arm64 libraries installed
# next to this machine's own (multiarch), so that the whole engine, the CLI and the C library
# build for arm64 and link the libraries an arm64 Debian has (what the arm64 Debian package
# depends on). Its programs run under qemu-aarch64 with Debian's arm64 loader and libraries.
# Adds arm64 to dpkg's architectures and installs what is missing (needs root or sudo then).
# scripts/cross-test-arm64.sh and scripts/test-deb-arm64.sh start with it.
# Usage: scripts/configure-arm64.sh [build dir] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-arm64}
shift || true

if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  sudo_cmd=""
  [[ $(id -u) -ne 0 ]] && sudo_cmd="sudo"
  echo "adding the arm64 architecture to dpkg (multiarch)"
  $sudo_cmd dpkg --add-architecture arm64  # install-packages.sh below runs apt-get update
fi
# The libraries of scripts/setup.sh for arm64 (header-only ones need no arm64 copy), and
# GoogleTest for the aarch64 test programs. apt keeps an :arm64 library and its amd64
# counterpart at the same version (it upgrades the amd64 one when the arm64 one is newer).
arm64_libraries=(
  libzstd-dev libpng-dev libjpeg-dev libwebp-dev libopenblas-dev libxxhash-dev libpcre2-dev
  libutf8proc-dev libcpp-httplib-dev libcurl4-openssl-dev libssl-dev libgtest-dev libgmock-dev
)
bash scripts/install-packages.sh cmake ninja-build pkg-config nlohmann-json3-dev libcli11-dev \
  g++-aarch64-linux-gnu qemu-user "${arm64_libraries[@]/%/:arm64}"

toolchain=cmake/aarch64-linux-gnu.cmake
if [[ -f "$build/CMakeCache.txt" ]] &&
   ! grep -q "^CMAKE_TOOLCHAIN_FILE:.*/$toolchain\$" "$build/CMakeCache.txt"; then
  echo "$build was configured without $toolchain (an older cross build): remove it first" >&2
  exit 1
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release --toolchain "$PWD/$toolchain" \
  -DKLEIN_BUILD_BENCH=OFF "$@" >/dev/null
