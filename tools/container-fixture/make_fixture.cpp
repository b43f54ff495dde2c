// Writes tests/data/checksums-v1.klein: a small container whose checksums were computed by the
// XXH3 implementation of the day it was written, so that later builds (another XXH3
// implementation, another library version) can prove they still read and verify what earlier
// ones wrote. Tensor sizes cover every length class of XXH3-64 (0-3, 4-8, 9-16, 17-128,
// 129-240 bytes, one and several 1 KiB stripes, several 64 KiB blocks) so that a divergence
// in any code path changes a checksum.
//
// Built and run once, against the container library of the commit named in
// tests/data/README.md:
//   g++ -std=c++20 -O2 -I. -Isrc tools/container-fixture/make_fixture.cpp \
//       build/libklein_container.a build/libklein_formats.a build/libklein_core.a \
//       -lzstd -lxxhash -o /tmp/make_fixture && /tmp/make_fixture tests/data/checksums-v1.klein
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/container/writer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fixture OUT.klein\n");
    return 2;
  }
  using klein::container::ContainerWriter;
  ContainerWriter w(argv[1]);
  w.write_metadata(R"({"purpose": "checksum fixture", "format": "klein container"})");
  const std::vector<std::vector<size_t>> units = {
      {2, 4, 8, 10, 16, 18, 128},
      {130, 240, 242, 1022, 1024, 1026},
      {4096 + 6, 65536 * 2 + 334},
  };
  uint32_t x = 2463534242u;  // xorshift32: the same bytes on every machine
  for (size_t u = 0; u < units.size(); ++u) {
    w.begin_unit("fixture.unit" + std::to_string(u));
    for (size_t t = 0; t < units[u].size(); ++t) {
      const size_t n = units[u][t];
      klein::container::TensorEntry e;
      e.name = "fixture.unit" + std::to_string(u) + ".tensor" + std::to_string(t);
      e.type = klein::DType::F16;  // byte sizes are even: 2 bytes a value
      e.shape = {int64_t(n / 2)};
      e.size = n;
      w.begin_tensor(e);
      std::vector<uint8_t> bytes(n);
      for (auto& b : bytes) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b = uint8_t(x);
      }
      w.write(bytes.data(), n);
      w.end_tensor();
    }
    w.end_unit();
  }
  w.commit();
  return 0;
}
