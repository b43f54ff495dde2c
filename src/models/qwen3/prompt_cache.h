#pragma once
// On-disk cache of text-encoder contexts: the same prompt with the same weights gives the
// same [512, 3 * hidden] context, so a second run skips 27 encoder layers.
//
// One file per entry, named by a hash of its key; the file also holds the whole key, so a
// hash collision reads as a miss, never as someone else's context. Entries are written to a
// temporary name and renamed, so concurrent writers cannot interleave; a reader verifies
// header, key and checksum and treats anything unexpected as a miss. The directory is kept
// under a size limit by deleting the least recently used entries.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "core/tensor.h"
#include "models/qwen3/text_encoder.h"

namespace klein::qwen3 {

// Part of every key. Bump it whenever a cached context would change without its key
// changing: the prompt template, the hidden layers taken, the encoder's numerics.
inline constexpr uint32_t kPromptCacheVersion = 1;

// What a context depends on: the weights (WeightStore::identity()) and the exact padded
// token ids and attention mask.
struct PromptCacheKey {
  std::string encoder_identity;
  std::vector<int32_t> ids;
  std::vector<int32_t> mask;

  // The exact bytes compared on lookup (version, identity, ids, mask).
  std::string bytes() const;
};

class PromptCache {
 public:
  static constexpr uint64_t kDefaultLimitBytes = uint64_t(1) << 30;

  // Entries live in `dir` (created on the first store); their total size is kept within
  // `limit_bytes`.
  explicit PromptCache(std::filesystem::path dir, uint64_t limit_bytes = kDefaultLimitBytes);

  // $XDG_CACHE_HOME/klein/prompts, else ~/.cache/klein/prompts.
  static std::filesystem::path default_dir();

  // The cached context, or nullopt when absent, unreadable or not exactly this key's.
  std::optional<Tensor> load(const PromptCacheKey& key) const;
  // Writes the entry atomically, then evicts the oldest entries beyond the limit. An entry
  // larger than the whole limit is not stored. Throws klein::Error naming the path when the
  // directory or file cannot be written.
  void store(const PromptCacheKey& key, const Tensor& context);

  const std::filesystem::path& dir() const { return dir_; }
  uint64_t limit_bytes() const { return limit_; }
  std::filesystem::path entry_path(const PromptCacheKey& key) const;

 private:
  void evict(const std::filesystem::path& keep) const;

  std::filesystem::path dir_;
  uint64_t limit_;
};

// A context and where it came from.
struct CachedContext {
  Tensor context;             // [seq, 3 * hidden]
  bool from_cache = false;
  std::string store_error;    // non-empty when the result could not be cached (still valid)
};

// The context for ids/mask: read from `cache` when it holds it, else computed by `encoder`
// and stored. `cache` may be null (no caching). A failure to write the cache does not fail
// the call: the context is returned with store_error set, for the caller to report.
CachedContext encode_with_cache(TextEncoder& encoder, PromptCache* cache,
                                std::span<const int32_t> ids, std::span<const int32_t> mask);

}  // namespace klein::qwen3
