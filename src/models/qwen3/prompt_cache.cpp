#include "models/qwen3/prompt_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/files.h"

namespace klein::qwen3 {

namespace fs = std::filesystem;

namespace {

// Entry file: header, key bytes, float32 payload, all in native byte order (the cache never
// leaves the machine that wrote it).
constexpr char kMagic[8] = {'K', 'L', 'E', 'I', 'N', 'P', 'C', '1'};
constexpr size_t kMaxRank = 4;
constexpr const char* kEntrySuffix = ".ctx";
// A temporary file this old belongs to a writer that died; younger ones may still be written.
constexpr auto kStaleTempAge = std::chrono::hours(1);

struct EntryHeader {
  char magic[8];
  uint64_t key_bytes;
  uint64_t rank;
  int64_t dims[kMaxRank];
  uint64_t checksum;  // XXH3-64 over the key bytes and the payload
};
static_assert(sizeof(EntryHeader) == 64);

uint64_t entry_checksum(std::string_view key, const void* payload, size_t payload_bytes) {
  XXH3_state_t* state = XXH3_createState();
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state);
  XXH3_64bits_update(state, key.data(), key.size());
  XXH3_64bits_update(state, payload, payload_bytes);
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

template <class T>
void append_raw(std::string& out, const T* data, size_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(T));
}

// Header fields that describe a well-formed entry of exactly `file_size` bytes.
bool header_is_sane(const EntryHeader& h, size_t file_size) {
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return false;
  if (h.rank == 0 || h.rank > kMaxRank) return false;
  uint64_t count = 1;
  for (uint64_t i = 0; i < h.rank; ++i) {
    if (h.dims[i] <= 0 || uint64_t(h.dims[i]) > file_size) return false;
    count *= uint64_t(h.dims[i]);
    if (count > file_size) return false;
  }
  return h.key_bytes <= file_size &&
         sizeof(EntryHeader) + h.key_bytes + count * sizeof(float) == file_size;
}

}  // namespace

std::string PromptCacheKey::bytes() const {
  std::string out = "klein prompt context v" + std::to_string(kPromptCacheVersion) + '\n';
  const uint64_t sizes[3] = {encoder_identity.size(), ids.size(), mask.size()};
  append_raw(out, sizes, 3);
  out += encoder_identity;
  append_raw(out, ids.data(), ids.size());
  append_raw(out, mask.data(), mask.size());
  return out;
}

PromptCache::PromptCache(fs::path dir, uint64_t limit_bytes)
    : dir_(std::move(dir)), limit_(limit_bytes) {}

fs::path PromptCache::default_dir() {
  // XDG base directory rules: a relative XDG_CACHE_HOME is to be ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && *xdg && fs::path(xdg).is_absolute()) return fs::path(xdg) / "klein" / "prompts";
  const char* home = std::getenv("HOME");
  check(home && *home, "no cache directory: neither XDG_CACHE_HOME nor HOME is set ",
        "(give one with --cache-dir)");
  return fs::path(home) / ".cache" / "klein" / "prompts";
}

fs::path PromptCache::entry_path(const PromptCacheKey& key) const {
  const std::string k = key.bytes();
  const XXH128_hash_t h = XXH3_128bits(k.data(), k.size());
  char name[33];
  std::snprintf(name, sizeof name, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return dir_ / (std::string(name) + kEntrySuffix);
}

std::optional<Tensor> PromptCache::load(const PromptCacheKey& key) const {
  const fs::path path = entry_path(key);
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  MappedFile file;
  try {
    file = MappedFile(path);
  } catch (const Error&) {
    return std::nullopt;  // removed or unreadable since the check: a miss
  }
  if (file.size() < sizeof(EntryHeader)) return std::nullopt;
  EntryHeader h;
  std::memcpy(&h, file.data(), sizeof h);
  if (!header_is_sane(h, file.size())) return std::nullopt;

  const std::string k = key.bytes();
  const auto* stored_key = reinterpret_cast<const char*>(file.data() + sizeof h);
  if (h.key_bytes != k.size() || std::memcmp(stored_key, k.data(), k.size()) != 0)
    return std::nullopt;
  const std::byte* payload = file.data() + sizeof h + h.key_bytes;
  const size_t payload_bytes = file.size() - sizeof h - h.key_bytes;
  if (entry_checksum(k, payload, payload_bytes) != h.checksum) return std::nullopt;

  Tensor out(Shape(h.dims, h.dims + h.rank));
  std::memcpy(out.data(), payload, payload_bytes);
  // Eviction removes the least recently *used* entries: a hit counts as a use.
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
  return out;
}

void PromptCache::store(const PromptCacheKey& key, const Tensor& context) {
  check(!context.shape().empty() && context.shape().size() <= kMaxRank,
        "prompt cache: cannot store a tensor of shape ", shape_str(context.shape()));
  const std::string k = key.bytes();
  const size_t payload_bytes = size_t(context.numel()) * sizeof(float);
  if (sizeof(EntryHeader) + k.size() + payload_bytes > limit_) return;

  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) fail("cannot create the prompt cache directory ", dir_.string(), ": ", ec.message());

  EntryHeader h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.key_bytes = k.size();
  h.rank = context.shape().size();
  std::copy(context.shape().begin(), context.shape().end(), h.dims);
  h.checksum = entry_checksum(k, context.data(), payload_bytes);

  const fs::path path = entry_path(key);
  AtomicFile out(path);
  out.write(&h, sizeof h);
  out.write(k);
  out.write(context.data(), payload_bytes);
  out.commit();
  evict(path);
}

// Deletes the least recently used entries until the rest fit the limit, and temporaries
// left by writers that died. Other processes may be deleting the same files: every
// filesystem error here just means someone else got there first.
void PromptCache::evict(const fs::path& keep) const {
  struct Entry {
    fs::path path;
    fs::file_time_type time;
    uint64_t size;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (fs::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    const fs::path& p = it->path();
    const auto time = fs::last_write_time(p, e);
    if (e || !it->is_regular_file(e)) continue;
    const std::string name = p.filename().string();
    if (name.find(".tmp-") != std::string::npos) {
      if (now - time > kStaleTempAge) fs::remove(p, e);
      continue;
    }
    if (p.extension() != kEntrySuffix) continue;
    const uint64_t size = fs::file_size(p, e);
    if (e) continue;
    total += size;
    if (p != keep) entries.push_back({p, time, size});
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.time != b.time ? a.time < b.time : a.path < b.path;
  });
  for (const Entry& e : entries) {
    if (total <= limit_) break;
    std::error_code rm;
    fs::remove(e.path, rm);
    total -= e.size;
  }
}

CachedContext encode_with_cache(TextEncoder& encoder, PromptCache* cache,
                                std::span<const int32_t> ids, std::span<const int32_t> mask) {
  CachedContext result;
  if (!cache) {
    result.context = encoder.encode(ids, mask);
    return result;
  }
  const PromptCacheKey key{encoder.weights_identity(), {ids.begin(), ids.end()},
                           {mask.begin(), mask.end()}};
  if (auto hit = cache->load(key)) {
    const Shape expected = {int64_t(ids.size()), encoder.config().context_dim()};
    if (hit->shape() == expected) {
      result.context = std::move(*hit);
      result.from_cache = true;
      return result;
    }
  }
  result.context = encoder.encode(ids, mask);
  try {
    cache->store(key, result.context);
  } catch (const Error& e) {
    result.store_error = e.what();
  }
  return result;
}

}  // namespace klein::qwen3
