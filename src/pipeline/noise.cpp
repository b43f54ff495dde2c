#include "pipeline/noise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/npy.h"
#include "core/random.h"

namespace klein {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c[0];
    const uint64_t p1 = uint64_t(kMul1) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1],
         uint32_t(p0)};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

std::vector<float> gaussian_noise(uint64_t seed, int64_t n, NoiseStream stream) {
  std::vector<float> out(static_cast<size_t>(n));
  const std::array<uint32_t, 2> key = {uint32_t(seed), uint32_t(seed >> 32)};
  const double two_pi = 6.283185307179586476925286766559;
  for (int64_t pair = 0; 2 * pair < n; ++pair) {
    const auto r = philox4x32(
        {uint32_t(pair), uint32_t(uint64_t(pair) >> 32), uint32_t(stream), 0}, key);
    const double u1 = (double(r[0]) + 1.0) / 4294967296.0;
    const double u2 = double(r[1]) / 4294967296.0;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    out[size_t(2 * pair)] = float(radius * std::cos(two_pi * u2));
    if (2 * pair + 1 < n) out[size_t(2 * pair + 1)] = float(radius * std::sin(two_pi * u2));
  }
  return out;
}

uint64_t random_seed() { return os_random_u64() % kRandomSeedBound; }

void fill_gaussian(Tensor& t, uint64_t seed, NoiseStream stream) {
  const std::vector<float> values = gaussian_noise(seed, t.numel(), stream);
  std::copy(values.begin(), values.end(), t.data());
}

Tensor read_noise_file(const std::filesystem::path& file, const Shape& expected,
                       const char* option) {
  const NpyArray a = read_npy(file);
  check(a.dtype == DType::F32 && a.shape == expected, option, " ", file.string(),
        ": expected float32 ", shape_str(expected), " for this size, got ", dtype_name(a.dtype),
        " ", shape_str(a.shape));
  Tensor t(Shape(expected.begin() + 1, expected.end()));
  std::memcpy(t.data(), a.bytes.data(), a.bytes.size());
  for (int64_t i = 0; i < t.numel(); ++i)
    check(std::isfinite(t.data()[i]), option, " ", file.string(), ": value ", i, " is ",
          t.data()[i], "; the noise must be finite");
  return t;
}

}  // namespace klein
