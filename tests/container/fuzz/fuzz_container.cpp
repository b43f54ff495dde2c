// libFuzzer target for the container's header, index and metadata parsers
// (scripts/fuzz-container.sh builds and runs it).
//
// The input is a header followed by index bytes. The checksums are re-sealed before parsing
// (a fuzzer cannot forge XXH3), so that what gets explored is the parsing behind them: every
// input must end in a valid parse or a klein::Error, never a crash, a hang or a huge
// allocation. The same bytes are also fed to the metadata reader as a zstd frame.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "formats/container/format.h"
#include "formats/container/reader.h"

namespace {

using namespace klein::container;

uint64_t get_le(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

void put_le(std::byte* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = std::byte((v >> (8 * i)) & 0xff);
}

void header_and_index(const uint8_t* data, size_t size) {
  if (size < kHeaderSize) return;
  std::vector<std::byte> b(reinterpret_cast<const std::byte*>(data),
                           reinterpret_cast<const std::byte*>(data) + size);
  const uint64_t header_size = get_le(b.data() + 12, 4);
  const size_t h = header_size >= kHeaderSize && header_size <= size && header_size % 8 == 0
                       ? size_t(header_size)
                       : kHeaderSize;
  // The index is whatever follows the header; its size and checksum are made to agree.
  const std::span<const std::byte> index(b.data() + h, size - h);
  put_le(b.data() + 80, index.size(), 8);
  put_le(b.data() + 88, xxh3(index.data(), index.size()), 8);
  put_le(b.data() + h - 8, xxh3(b.data(), h - 8), 8);
  // The file size the header claims stands for the real one (the data is not there).
  const uint64_t claimed = get_le(b.data() + 24, 8);
  try {
    const Header hd = decode_header(std::span<const std::byte>(b.data(), h), claimed, "fuzz");
    (void)decode_index(hd, index, "fuzz");
  } catch (const klein::Error&) {
  }
}

void metadata(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  Header h;
  h.metadata_offset = 0;
  h.metadata_size = size;
  h.metadata_raw_size = size >= 8 ? get_le(file.data(), 8) % (uint64_t(1) << 20) : 0;
  h.metadata_xxh3 = xxh3(data, size);
  try {
    const std::string text = read_metadata_text(file, h, "fuzz");
    (void)nlohmann::json::parse(text, nullptr, false);
  } catch (const klein::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  header_and_index(data, size);
  metadata(data, size);
  return 0;
}
