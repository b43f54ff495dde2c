#pragma once
// Random bits from the operating system, for what must not repeat or be guessed: the seed of a
// generation the user did not give, a server job's id.
//
// Not std::random_device: libstdc++'s default device reads the CPU's RDSEED wherever CPUID
// lists it, and on a Zen 5 EPYC (family 26) RDSEED handed back the value it had just given in
// one draw in 400 to 600, so two random seeds in a row were the same seed (and the same image)
// far more often than one time in 2^32 (docs/TESTING.md, "Zen 5"). The kernel's generator does not
// stand on one instruction of one CPU.
#include <cstdint>

namespace klein {

// 64 random bits from the kernel (getrandom(2); /dev/urandom where that call is missing).
// Throws klein::Error if neither can be read.
uint64_t os_random_u64();

}  // namespace klein
