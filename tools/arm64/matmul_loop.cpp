// Runs one quantized matmul shape a given number of times on one thread, for counting the
// instructions the integer kernels execute under qemu (count-instructions.sh). Weights are
// random blocks (random bytes with finite scales, so that no quantization search runs) and
// activations random floats; the result is printed so that nothing is optimised away.
//
//   matmul_loop q8|q4 M N K repetitions
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/threadpool.h"
#include "quant/matmul.h"

int main(int argc, char** argv) {
  using namespace klein;
  using namespace klein::quant;
  if (argc != 6 || (std::strcmp(argv[1], "q8") != 0 && std::strcmp(argv[1], "q4") != 0)) {
    std::fprintf(stderr, "usage: %s q8|q4 M N K repetitions\n", argv[0]);
    return 2;
  }
  const DType type = std::strcmp(argv[1], "q8") == 0 ? DType::Q8 : DType::Q4;
  const int64_t M = std::atoll(argv[2]), N = std::atoll(argv[3]), K = std::atoll(argv[4]);
  const int reps = std::atoi(argv[5]);
  // A few instructions per value (the set-up runs under qemu's instruction log too).
  uint32_t state = 1;
  auto rng = [&state] {
    state ^= state << 13, state ^= state >> 17, state ^= state << 5;
    return state;
  };
  std::vector<float> x(size_t(M * K)), y(size_t(M * N));
  for (float& v : x) v = float(int32_t(rng() >> 16) - 32768) / 8192.0f;
  std::vector<uint8_t> blocks(storage_bytes(type, Layout::RowMajor, N, K));
  for (uint8_t& b : blocks) b = uint8_t(rng() & 0x3f);  // f16 scales below 2 (no inf / NaN)
  std::vector<uint8_t> bytes(storage_bytes(type, Layout::Interleaved16, N, K));
  pack_blocks(blocks.data(), N, K, type, Layout::Interleaved16, bytes.data());
  const Matrix m{type, Layout::Interleaved16, N, K, bytes.data(), bytes.size()};
  ThreadPool pool(1);
  MatmulScratch scratch;
  MatmulOptions options;
  options.scratch = &scratch;
  double sum = 0;
  for (int r = 0; r < reps; ++r) {
    matmul(x.data(), M, K, m, y.data(), N, pool, options);
    sum += y[size_t(r) % y.size()];
  }
  std::printf("%g\n", sum);
  return 0;
}
