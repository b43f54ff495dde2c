// The on-disk prompt cache: hits, misses, damaged entries, the size bound, concurrent writers.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "core/npy.h"
#include "ops/compute.h"
#include "models/qwen3/prompt_cache.h"
#include "support/testing.h"
#include "weights/model_source.h"

namespace klein::qwen3 {
namespace {

namespace fs = std::filesystem;
using klein::testing::temp_dir;

PromptCacheKey make_key(int32_t first_id, std::string identity = "model-a") {
  PromptCacheKey key{std::move(identity), std::vector<int32_t>(512, 151643),
                     std::vector<int32_t>(512, 0)};
  key.ids[0] = first_id;
  key.mask[0] = 1;
  return key;
}

Tensor filled(float value, Shape shape = {512, 192}) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = value + float(i % 97) * 0.25f;
  return t;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)) == 0;
}

uint64_t dir_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += e.file_size();
  return total;
}

TEST(PromptCache, StoredEntryIsReadBackExactly) {
  PromptCache cache(temp_dir("cache_hit") / "nested" / "prompts");
  const auto key = make_key(7);
  EXPECT_FALSE(cache.load(key).has_value());  // nothing yet, directory not even created
  const Tensor ctx = filled(1.5f);
  cache.store(key, ctx);
  auto hit = cache.load(key);
  ASSERT_TRUE(hit.has_value());
  EXPECT_TRUE(same(*hit, ctx));
}

TEST(PromptCache, AnyDifferenceInTheKeyIsAMiss) {
  PromptCache cache(temp_dir("cache_keys"));
  const auto key = make_key(7);
  cache.store(key, filled(1.0f));
  EXPECT_FALSE(cache.load(make_key(8)).has_value());
  EXPECT_FALSE(cache.load(make_key(7, "model-b")).has_value());
  auto other_mask = key;
  other_mask.mask[1] = 1;
  EXPECT_FALSE(cache.load(other_mask).has_value());
  EXPECT_TRUE(cache.load(key).has_value());
}

TEST(PromptCache, DamagedEntriesAreMisses) {
  PromptCache cache(temp_dir("cache_damage"));
  const auto key = make_key(3);
  const Tensor ctx = filled(2.0f);
  const fs::path path = cache.entry_path(key);

  auto damage = [&](auto&& how) {
    cache.store(key, ctx);
    ASSERT_TRUE(cache.load(key).has_value());
    how();
    EXPECT_FALSE(cache.load(key).has_value());
  };
  // One flipped bit in the payload: caught by the checksum.
  damage([&] {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char c;
    f.get(c);
    f.seekp(-100, std::ios::end);
    f.put(char(c ^ 0x10));
  });
  // Cut short, as by a full disk on a filesystem without atomic rename.
  damage([&] { fs::resize_file(path, fs::file_size(path) / 2); });
  // Empty, and garbage.
  damage([&] { fs::resize_file(path, 0); });
  damage([&] { std::ofstream(path, std::ios::binary) << "not a cache entry at all"; });
  // A header that claims a different shape.
  damage([&] {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(24);  // dims[0]
    const int64_t dim = 256;
    f.write(reinterpret_cast<const char*>(&dim), sizeof dim);
  });
  // A directory where the entry should be.
  damage([&] {
    fs::remove(path);
    fs::create_directory(path);
  });
  fs::remove(path);
  // After all that, storing again works.
  cache.store(key, ctx);
  EXPECT_TRUE(cache.load(key).has_value());
}

TEST(PromptCache, KeepsWithinTheSizeLimitByDroppingLeastRecentlyUsed) {
  const fs::path dir = temp_dir("cache_limit");
  const Tensor ctx = filled(0.0f, {64, 64});  // 16 KiB payload
  PromptCache probe(dir);
  probe.store(make_key(0), ctx);
  const uint64_t entry = fs::file_size(probe.entry_path(make_key(0)));
  fs::remove(probe.entry_path(make_key(0)));

  PromptCache cache(dir, 3 * entry + entry / 2);  // room for three entries
  // Give every entry a distinct, increasing age so that the order is unambiguous.
  const auto base = fs::file_time_type::clock::now() - std::chrono::hours(2);
  for (int i = 0; i < 4; ++i) {
    cache.store(make_key(i), ctx);
    fs::last_write_time(cache.entry_path(make_key(i)), base + std::chrono::minutes(i));
  }
  // Entry 0 was the oldest when entry 3 arrived.
  EXPECT_FALSE(cache.load(make_key(0)).has_value());
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(fs::exists(cache.entry_path(make_key(i)))) << i;

  // Reading entry 1 makes it the most recently used, so entry 2 goes next.
  ASSERT_TRUE(cache.load(make_key(1)).has_value());
  cache.store(make_key(4), ctx);
  EXPECT_TRUE(cache.load(make_key(1)).has_value());
  EXPECT_FALSE(fs::exists(cache.entry_path(make_key(2))));
  EXPECT_TRUE(cache.load(make_key(3)).has_value());
  EXPECT_TRUE(cache.load(make_key(4)).has_value());
  EXPECT_LE(dir_bytes(dir), cache.limit_bytes());

  // An entry larger than the whole limit is not stored (and evicts nothing).
  cache.store(make_key(5), filled(0.0f, {512, 192}));
  EXPECT_FALSE(cache.load(make_key(5)).has_value());
  EXPECT_TRUE(cache.load(make_key(4)).has_value());
}

TEST(PromptCache, LeftoverTemporariesOfDeadWritersAreRemoved) {
  PromptCache cache(temp_dir("cache_temps"));
  cache.store(make_key(1), filled(1.0f));
  const fs::path stale = cache.dir() / "deadbeef.ctx.tmp-99999";
  const fs::path fresh = cache.dir() / "cafe.ctx.tmp-99998";
  std::ofstream(stale) << "partial";
  std::ofstream(fresh) << "being written";
  fs::last_write_time(stale, fs::file_time_type::clock::now() - std::chrono::hours(3));
  cache.store(make_key(2), filled(2.0f));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
}

// Two processes keep rewriting the same entry with different contents while this one reads:
// every hit must be exactly one of the two tensors, never a mixture or a partial file.
TEST(PromptCache, ConcurrentWritersNeverExposeAPartialEntry) {
  const fs::path dir = temp_dir("cache_race");
  const auto key = make_key(9);
  const Tensor a = filled(1.0f), b = filled(-1.0f);
  pid_t writers[2];
  for (int w = 0; w < 2; ++w) {
    writers[w] = ::fork();
    ASSERT_GE(writers[w], 0);
    if (writers[w] == 0) {
      PromptCache cache(dir);
      for (int i = 0; i < 40; ++i) cache.store(key, w == 0 ? a : b);
      ::_exit(0);
    }
  }
  PromptCache reader(dir);
  int hits = 0, torn = 0;
  for (int i = 0; i < 400; ++i) {
    if (auto t = reader.load(key)) {
      ++hits;
      if (!same(*t, a) && !same(*t, b)) ++torn;
    }
  }
  for (pid_t pid : writers) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(torn, 0) << "of " << hits << " hits";
  auto final_entry = reader.load(key);
  ASSERT_TRUE(final_entry.has_value());
  EXPECT_TRUE(same(*final_entry, a) || same(*final_entry, b));
}

TEST(PromptCache, DefaultDirectoryFollowsXdgThenHome) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/somewhere/cache", 1);
  EXPECT_EQ(PromptCache::default_dir(), fs::path("/somewhere/cache/klein/prompts"));
  ::setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  EXPECT_EQ(PromptCache::default_dir(),
            fs::path(std::getenv("HOME")) / ".cache" / "klein" / "prompts");
  if (old_xdg)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
}

TEST(PromptCache, EncodeWithCacheComputesOnceThenReads) {
  auto store = open_model(klein::testing::tiny_model());
  Compute cx(2);
  TextEncoder encoder(*store, cx);
  const auto dir = klein::testing::tiny_vectors() / "tokenizer";
  const auto ids64 = read_npy(dir / "prompt1_input_ids.npy").to_i64();
  const auto mask64 = read_npy(dir / "prompt1_attention_mask.npy").to_i64();
  const std::vector<int32_t> ids(ids64.begin(), ids64.end()), mask(mask64.begin(), mask64.end());

  PromptCache cache(temp_dir("cache_encode"));
  const CachedContext first = encode_with_cache(encoder, &cache, ids, mask);
  EXPECT_FALSE(first.from_cache);
  EXPECT_TRUE(first.store_error.empty()) << first.store_error;
  const CachedContext second = encode_with_cache(encoder, &cache, ids, mask);
  EXPECT_TRUE(second.from_cache);
  EXPECT_TRUE(same(first.context, second.context));
  EXPECT_TRUE(klein::testing::matches_npy(
      second.context, klein::testing::tiny_vectors() / "text_encoder" / "prompt1_context.npy",
      1e-4));

  // A cache that cannot be written still gives the context, and says why it was not kept.
  const fs::path blocker = temp_dir("cache_blocked") / "file";
  std::ofstream(blocker) << "a file, not a directory";
  PromptCache blocked(blocker / "prompts");
  const CachedContext third = encode_with_cache(encoder, &blocked, ids, mask);
  EXPECT_FALSE(third.from_cache);
  EXPECT_NE(third.store_error.find(blocker.string()), std::string::npos) << third.store_error;
  EXPECT_TRUE(same(first.context, third.context));

  const CachedContext uncached = encode_with_cache(encoder, nullptr, ids, mask);
  EXPECT_FALSE(uncached.from_cache);
  EXPECT_TRUE(same(first.context, uncached.context));
}

}  // namespace
}  // namespace klein::qwen3
