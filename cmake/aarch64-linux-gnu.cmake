# Cross build for 64-bit ARM Linux (Debian's arm64: Raspberry Pi OS, Armbian) on a Debian
# amd64 machine, with Debian's cross compiler (g++-aarch64-linux-gnu) and Debian's arm64
# libraries installed side by side with the machine's own (multiarch: `dpkg
# --add-architecture arm64`, then the libraries' -dev packages with an :arm64 suffix;
# scripts/cross-test-arm64.sh does both). Programs built here run under qemu-aarch64.
#
#   cmake -S . -B build-arm64 -G Ninja --toolchain cmake/aarch64-linux-gnu.cmake
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# Debian's multiarch directories: libraries and CMake packages under /usr/lib/aarch64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# The arm64 libraries' pkg-config files only, never the machine's own (whose -L and -I would
# link amd64 libraries into an arm64 program). Set here so that every re-run of CMake during a
# build sees it too.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# The test programs (ctest, gtest_discover_tests) run under qemu; the loader and libraries are
# Debian's arm64 ones (libc6:arm64, installed with the -dev packages).
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
