#pragma once
// The initial noise of a generation, from our own documented generator so that a seed means
// the same image on every machine, build and thread count.
//
// Generator: Philox-4x32 with 10 rounds (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11), key = the 64-bit seed (low word first), counter = (pair index low word,
// pair index high word, 0, 0). Each counter value gives four 32-bit words r0..r3; the pair
// (2p, 2p+1) of standard normal values comes from r0, r1 by the Box-Muller transform in
// double precision:
//   u1 = (r0 + 1) / 2^32   (in (0, 1], so log is finite)
//   u2 = r1 / 2^32
//   z0 = sqrt(-2 ln u1) cos(2 pi u2),  z1 = sqrt(-2 ln u1) sin(2 pi u2)
// rounded to float32. Element i of the noise tensor [1, 128, H/16, W/16] (C order) is value i
// of this sequence. Every value depends only on (seed, i), never on threads or order.
#include <array>
#include <cstdint>
#include <vector>

namespace klein {

// Words r0..r3 of Philox-4x32-10 for one counter and key (exposed for tests).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// n standard normal values of the sequence above.
std::vector<float> gaussian_noise(uint64_t seed, int64_t n);

}  // namespace klein
