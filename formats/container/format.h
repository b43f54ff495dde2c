#pragma once
// The klein container: one file holding a whole model (configuration, tokenizer, every
// tensor at its chosen storage type), laid out so that groups of tensors ("units") can be
// mapped and dropped independently. This header is the byte layout only: it knows nothing
// about models. The full specification, written for someone building another reader, is
// docs/container.md; the summary:
//
//   header   128 bytes at offset 0: magic, version, offsets and sizes of the other sections,
//            XXH3-64 of the metadata and of the index, and XXH3-64 of the header itself
//   units    each unit's tensors, contiguous, the unit starting at a multiple of `alignment`
//            (>= 64 KiB) and each tensor at a multiple of 64 bytes inside it
//   metadata a zstd frame holding UTF-8 JSON (configuration, tokenizer files, conversion
//            record); klein convert places it after the last unit
//   index    the unit table and the tensor table (binary, below); the writer places it last
//
// All integers are little-endian. Checksums are XXH3-64 (xxHash's XXH3_64bits, seed 0).
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace klein::container {

// 0x89 'K' 'L' 'E' 'I' 'N' '\r' '\n': a high byte and a CR LF pair, like PNG's signature, so
// that 7-bit or text-mode transfers are caught as a wrong magic.
inline constexpr std::array<uint8_t, 8> kMagic = {0x89, 'K', 'L', 'E', 'I', 'N', '\r', '\n'};

// Versioning: a reader accepts any minor version of the major versions it knows; a change
// that an older reader of the same major version could misread bumps the major version.
inline constexpr uint16_t kMajorVersion = 1;
inline constexpr uint16_t kMinorVersion = 0;

inline constexpr size_t kHeaderSize = 128;
inline constexpr uint64_t kMinAlignment = uint64_t(64) << 10;  // unit alignment, at least
inline constexpr uint64_t kMaxAlignment = uint64_t(1) << 30;
inline constexpr uint64_t kTensorAlignment = 64;  // inside a unit
// Bounds a reader enforces so that a corrupt file cannot ask for absurd allocations.
inline constexpr uint64_t kMaxMetadataBytes = uint64_t(1) << 30;  // decompressed
inline constexpr uint64_t kMaxIndexBytes = uint64_t(1) << 30;
inline constexpr size_t kMaxNameBytes = 1024;
inline constexpr size_t kMaxDims = 8;

// Flag bits 0..31 are "required": a reader that does not know a set bit must refuse the
// file. Bits 32..63 are "optional": a reader may ignore them. Version 1.0 defines none.
inline constexpr uint64_t kRequiredFlagsMask = 0xffffffffull;

// Storage type codes on disk (stable; not the in-memory DType values).
enum class StorageCode : uint8_t { F32 = 0, F16 = 1, BF16 = 2, Q8 = 3, Q4 = 4 };

uint8_t storage_code(DType t);  // throws for types a container cannot store
// The DType of a code, or false when the code is unknown.
bool dtype_of_code(uint8_t code, DType& out);

struct Header {
  uint16_t major = kMajorVersion;
  uint16_t minor = kMinorVersion;
  uint32_t header_size = kHeaderSize;
  uint64_t flags = 0;
  uint64_t file_size = 0;
  uint64_t alignment = kMinAlignment;
  uint64_t metadata_offset = 0;
  uint64_t metadata_size = 0;      // compressed bytes on disk
  uint64_t metadata_raw_size = 0;  // JSON bytes after decompression
  uint64_t metadata_xxh3 = 0;      // of the compressed bytes
  uint64_t index_offset = 0;
  uint64_t index_size = 0;
  uint64_t index_xxh3 = 0;
  uint64_t data_offset = 0;  // first byte of the first unit
  uint64_t data_size = 0;    // through the last byte of the last unit
  uint32_t unit_count = 0;
  uint32_t tensor_count = 0;
  uint64_t header_xxh3 = 0;  // of bytes [0, header_size - 8)
};

struct UnitEntry {
  std::string name;
  uint32_t first_tensor = 0;  // the unit's tensors are [first_tensor, first_tensor + tensor_count)
  uint32_t tensor_count = 0;
  uint64_t offset = 0;  // absolute, multiple of the header's alignment
  uint64_t size = 0;    // from the first tensor's first byte to the last tensor's last
  uint64_t xxh3 = 0;    // of bytes [offset, offset + size), padding included
};

struct TensorEntry {
  std::string name;
  DType type = DType::F32;
  uint8_t layout = 0;       // arrangement of the bytes for the kernels; 0 = row-major
  uint32_t block_size = 1;  // elements per quantization block; 1 for plain types
  Shape shape;
  uint64_t offset = 0;  // absolute, multiple of 64, inside its unit
  uint64_t size = 0;
  uint64_t xxh3 = 0;
};

struct Index {
  std::vector<UnitEntry> units;
  std::vector<TensorEntry> tensors;
};

uint64_t xxh3(const void* data, size_t n);
std::string hex64(uint64_t v);  // "00ff..." (16 digits), how checksums are shown

// Serialisation. encode_header computes header_xxh3 (the field of `h` is ignored).
std::array<std::byte, kHeaderSize> encode_header(const Header& h);
std::vector<std::byte> encode_index(const Index& index);

// True when `bytes` starts with the magic.
bool has_magic(std::span<const std::byte> bytes);

// Parses and checks the header against the real size of the file. `where` names the file in
// errors. Errors, each specific: not a container (magic), a newer format version, unknown
// required flags, a corrupt header (checksum), a truncated file, sections outside the file
// or overlapping.
Header decode_header(std::span<const std::byte> bytes, uint64_t actual_file_size,
                     const std::string& where);

// Parses the index bytes (already checked against header.index_xxh3 by the caller, or not:
// the parser never reads outside `bytes` either way) and checks its consistency with the
// header: counts, unique names, units inside the data section and aligned and disjoint,
// tensors inside their unit, 64-byte aligned and disjoint, known storage types.
Index decode_index(const Header& header, std::span<const std::byte> bytes,
                   const std::string& where);

}  // namespace klein::container
