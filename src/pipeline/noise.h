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
//
// Other draws of a generation take other streams of the same seed: stream s puts s in the
// counter's third word, (pair low, pair high, s, 0). Stream 0 is the initial noise above;
// stream 1 the VAE's posterior sample of an init image (Z-Image's image-to-image encodes
// mean + std · ε, ε from stream 1).
//
// Any 64-bit seed is valid. A seed drawn at random is below 2^32 (random_seed).
#include <array>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "core/tensor.h"

namespace klein {

// Words r0..r3 of Philox-4x32-10 for one counter and key (exposed for tests).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

enum class NoiseStream : uint32_t { initial = 0, vae_sample = 1 };

// n standard normal values of the sequence above.
std::vector<float> gaussian_noise(uint64_t seed, int64_t n,
                                  NoiseStream stream = NoiseStream::initial);

// Fills `t` with gaussian_noise(seed, t.numel(), stream).
void fill_gaussian(Tensor& t, uint64_t seed, NoiseStream stream = NoiseStream::initial);

// Seeds drawn at random are below this bound. A seed is only useful if it survives the trip
// from the image to the user and back: a JSON number read by JavaScript (and by many other
// clients) is a double, exact only up to 2^53 - 1, so a random 64-bit seed came back as
// another number, and so another image. 32 bits are what AUTOMATIC1111 draws too, and a batch
// that counts up from a drawn seed (seed, seed + 1, ...) stays far below 2^53.
constexpr uint64_t kRandomSeedBound = uint64_t(1) << 32;

// A seed from the operating system's random source, in [0, kRandomSeedBound): the one way a
// front end or the pipeline picks a seed the user did not give.
uint64_t random_seed();

// The initial noise a user gave as a file (--noise): a float32 .npy of shape `expected`
// ([1, C, h, w]), every value finite, returned as [C, h, w]. Read when a generation starts,
// so that a wrong file is refused before the text encoder runs.
// `option` names the option in errors ("--noise", "--vae-noise").
Tensor read_noise_file(const std::filesystem::path& file, const Shape& expected,
                       const char* option = "--noise");

}  // namespace klein
