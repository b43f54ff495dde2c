#!/usr/bin/env bash
# Installs the build dependencies (Debian 12 packages only) and builds klein in ./build.
# Idempotent: packages already present are left alone; the build is incremental.
# Usage: scripts/setup.sh [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config lld
  libzstd-dev libpng-dev libjpeg-dev libwebp-dev libopenblas-dev libxxhash-dev libcli11-dev
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcpp-httplib-dev libcurl4-openssl-dev
  libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)
if [[ "${KLEIN_CROSS:-0}" == 1 ]]; then
  packages+=(g++-aarch64-linux-gnu qemu-user)
fi

bash scripts/install-packages.sh "${packages[@]}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build
