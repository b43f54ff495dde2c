#pragma once
// Writing GGUF files in tests (version 3, alignment 32): tensors of F32 / F16 / BF16, or of
// GGML blocks of Q8_0 / Q4_0 made by the test, with their shape given in our order (written
// as ne, innermost first), and metadata of strings, integers and arrays of them. The files
// gguf-py writes are in tests/data/gguf; this writer makes model-sized files from the tiny
// model without Python.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "formats/st_files.h"

namespace klein::testing {

struct GgufKey {
  std::string key;
  // string, u32, f32, or arrays of strings / i32
  std::variant<std::string, uint32_t, float, std::vector<std::string>, std::vector<int32_t>> value;
};

// `tensors` as StTensor: dtype "F32", "F16" or "BF16" with the values; or "Q8_0" (GGML type
// 8: 34 bytes per 32 values) or "Q4_0" (type 2: 18 bytes per 32 values) with `bytes` holding
// the blocks, row after row, and `shape` the shape of the values (the innermost extent a
// multiple of 32).
void write_gguf(const std::filesystem::path& path, const std::vector<GgufKey>& metadata,
                const std::vector<StTensor>& tensors);

// The tiny Qwen3 under llama.cpp's names, with its tokenizer in the metadata as llama.cpp's
// converter writes it: tokens in id order padded to the vocabulary size, their types
// (1 normal, 3 control = special added, 4 user-defined = other added, 5 unused padding).
// `transform`, when given, sees each tensor under its transformers name before it is renamed
// and may change its type and bytes.
void write_llama_cpp_text_encoder(const std::filesystem::path& path,
                                  const std::function<void(StTensor&)>& transform = {});

}  // namespace klein::testing
