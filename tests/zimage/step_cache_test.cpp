// Step caching against diffusers' FirstBlockCache: tests/data/zimage-cache holds three runs of
// the official ZImagePipeline with the official hook on zimage-tiny's transformer
// (tools/refgen/gen_zimage_cache.py): the change the hook computed and its decision at every
// transformer call, and the latents after every step. The engine's FirstBlockCache, driven as
// the family's denoise drives it, must make the same decisions, compute the same changes, and
// give every step's latents within 1e-4 scaled (each step from the official latents of the step
// before; free-running, within the set's free-running targets).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/files.h"
#include "core/npy.h"
#include "models/zimage/checkpoint/units.h"
#include "models/zimage/sampler.h"
#include "models/zimage/step_cache.h"
#include "models/zimage/transformer.h"
#include "support/forwarding_store.h"
#include "support/testing.h"
#include "zimage/file_store.h"

namespace klein::zimage {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path zimage_set_dir() { return testing::tiny_dir().parent_path() / "zimage-tiny"; }
fs::path step_cache_dir() {
  return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "zimage-cache";
}
json case_json(const fs::path& p) { return json::parse(read_text_file(p)); }

Tensor cache_npy(const fs::path& p) { return read_npy(p).to_tensor(); }

struct CachedRun {
  std::vector<double> changes;
  std::vector<bool> decisions;
  std::vector<Tensor> latents;  // after each step
};

// The official pipeline's loop with the cache at `threshold` (negative: no cache, the plain
// forward per sequence). With `forced`, each step starts from the official latents of the
// step before (the run's own are still returned): the per-step comparison.
CachedRun run_case(const json& info, double threshold, const fs::path& forced = {}) {
  Compute cx(2);
  const fs::path model = zimage_set_dir() / "model";
  const TransformerConfig tc =
      parse_transformer_config(case_json(model / "transformer" / "config.json"), "t");
  testing::ComponentFileStore store(
      model / "transformer" / "diffusion_pytorch_model.safetensors", "transformer",
      transformer_unit_of);
  Transformer transformer(store, tc);
  const fs::path vectors = zimage_set_dir() / "vectors" / "e2e";
  const Tensor prompt = cache_npy(vectors / info["prompt_embeds"].get<std::string>());
  Tensor x = cache_npy(vectors / info["noise"].get<std::string>());
  x.reshape({x.dim(1), x.dim(2), x.dim(3)});
  const int64_t H = x.dim(1), W = x.dim(2);
  Activations positive(tc, {H, W, prompt.dim(0), tc.patch});
  transformer.embed_caption(prompt, positive, cx);
  Guidance g;
  g.scale = info["guidance_scale"].get<float>();
  std::unique_ptr<Activations> negative;
  std::vector<Activations*> batch{&positive};
  if (g.scale > 0) {
    const std::string file = info["negative_prompt_embeds"].get<std::string>();
    const fs::path path = file.find('/') == std::string::npos
                              ? step_cache_dir() / info["name"].get<std::string>() / file
                              : vectors / file;
    const Tensor neg = cache_npy(path);
    negative = std::make_unique<Activations>(tc, SequenceLayout{H, W, neg.dim(0), tc.patch});
    transformer.embed_caption(neg, *negative, cx);
    batch.push_back(negative.get());
  }
  const SchedulerConfig sc = parse_scheduler_config(
      case_json(model / "scheduler" / "scheduler_config.json"), "scheduler");
  const Schedule s = make_schedule(sc, info["steps"].get<int64_t>());
  std::unique_ptr<FirstBlockCache> cache;
  if (threshold >= 0) cache = std::make_unique<FirstBlockCache>(threshold);
  CachedRun run;
  Tensor v(x.shape());
  for (int64_t i = 0; i < s.steps(); ++i) {
    const Tensor adaln = transformer.embed_timestep(s.model_time(i), cx);
    std::vector<Tensor> out;
    if (cache) {
      out = cache->forward(transformer, x, adaln, batch, cx);
    } else {
      for (Activations* a : batch) out.push_back(transformer.forward(x, adaln, *a, cx));
    }
    velocity(out[0].data(), g.scale > 0 ? out[1].data() : nullptr, x.numel(), g, v.data());
    euler_step(x.data(), v.data(), x.numel(), s.sigmas[size_t(i)], s.sigmas[size_t(i + 1)]);
    run.latents.push_back(x.copy());
    if (!forced.empty()) {
      Tensor official = cache_npy(forced / ("step" + std::to_string(i) + "_latents.npy"));
      official.reshape(x.shape());
      x = std::move(official);
    }
  }
  if (cache) {
    run.changes = cache->changes();
    run.decisions = cache->decisions();
    EXPECT_EQ(cache->computed() + cache->skipped(), s.steps());
  }
  return run;
}

class StepCache : public ::testing::TestWithParam<const char*> {};

TEST_P(StepCache, MatchesDiffusersFirstBlockCache) {
  const fs::path dir = step_cache_dir() / GetParam();
  const json info = case_json(dir / "case.json");
  const CachedRun run = run_case(info, info["threshold"].get<double>(), dir);
  const json& calls = info["calls"];
  ASSERT_EQ(run.decisions.size(), calls.size());
  int64_t skipped = 0;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(run.decisions[i], calls[i]["computed"].get<bool>()) << "call " << i;
    skipped += !run.decisions[i];
    if (calls[i]["relative_change"].is_null()) {
      EXPECT_TRUE(std::isnan(run.changes[i])) << "call " << i;
    } else {
      const double want = calls[i]["relative_change"].get<double>();
      EXPECT_NEAR(run.changes[i], want, 1e-4 * want) << "call " << i;
    }
  }
  EXPECT_EQ(skipped, info["skipped"].get<int64_t>());
  EXPECT_GT(skipped, 0);  // the case skips some steps, or it tests nothing of the cache
  for (size_t i = 0; i < run.latents.size(); ++i)
    EXPECT_TRUE(testing::matches_npy(run.latents[i],
                                     dir / ("step" + std::to_string(i) + "_latents.npy"), 1e-4))
        << "step " << i;
}

// Free-running, the differences of the steps add up, more under strong guidance (the set's
// free-running targets: 1e-4 scaled without guidance, 5e-4 with guidance 4); the decisions
// must still be the official ones.
TEST_P(StepCache, FreeRunningStaysWithinTheSetsTargets) {
  const fs::path dir = step_cache_dir() / GetParam();
  const json info = case_json(dir / "case.json");
  const CachedRun run = run_case(info, info["threshold"].get<double>());
  const json& calls = info["calls"];
  ASSERT_EQ(run.decisions.size(), calls.size());
  for (size_t i = 0; i < calls.size(); ++i)
    EXPECT_EQ(run.decisions[i], calls[i]["computed"].get<bool>()) << "call " << i;
  const double target = info["guidance_scale"].get<double>() > 0 ? 5e-4 : 1e-4;
  EXPECT_TRUE(testing::matches_npy(run.latents.back(), dir / "final_latents.npy", target));
}

INSTANTIATE_TEST_SUITE_P(Official, StepCache, ::testing::Values("turbo", "cfg", "cfg_padded"),
                         [](const auto& info) { return std::string(info.param); });

// A threshold of 0 skips nothing (every change is above it), and a step that runs every layer
// is the plain forward's arithmetic: the latents are the uncached run's bit for bit.
TEST(StepCacheZero, ComputesEveryStepAsThePlainForward) {
  const json info = case_json(step_cache_dir() / "cfg_padded" / "case.json");
  const CachedRun cached = run_case(info, 0.0);
  const CachedRun plain = run_case(info, -1.0);
  for (bool d : cached.decisions) EXPECT_TRUE(d);
  ASSERT_EQ(cached.latents.size(), plain.latents.size());
  for (size_t i = 0; i < plain.latents.size(); ++i)
    EXPECT_EQ(testing::scaled_diff(cached.latents[i].data(), plain.latents[i].data(),
                                   plain.latents[i].numel()),
              0.0)
        << "step " << i;
}

// The units a store is asked for, in order: "prefetch U" and "acquire U".
class LoggingStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  UnitRef acquire(const std::string& unit) override {
    events.push_back("acquire " + unit);
    return inner_.acquire(unit);
  }
  void prefetch(const std::string& unit) override { events.push_back("prefetch " + unit); }
  std::vector<std::string> events;
};

// What a paged store reads ahead follows the decisions: a skipped step asks for no main layer
// after the first (not even ahead), and after its layer 0 the next unit read is the next
// step's first; a computed step reads each layer once per sequence, as the plain forward does.
TEST(StepCacheReadAhead, ASkippedStepReadsNoLaterLayer) {
  Compute cx(2);
  const fs::path model = zimage_set_dir() / "model";
  const TransformerConfig tc =
      parse_transformer_config(case_json(model / "transformer" / "config.json"), "t");
  ASSERT_GE(tc.n_layers, 2);
  testing::ComponentFileStore files(
      model / "transformer" / "diffusion_pytorch_model.safetensors", "transformer",
      transformer_unit_of);
  LoggingStore store(files);
  Transformer transformer(store, tc);
  Activations pos(tc, {8, 8, 18, tc.patch}), neg(tc, {8, 8, 40, tc.patch});
  transformer.embed_caption(testing::random_tensor({18, tc.cap_feat_dim}, 1), pos, cx);
  transformer.embed_caption(testing::random_tensor({40, tc.cap_feat_dim}, 2), neg, cx);
  const Tensor x = testing::random_tensor({tc.in_channels, 8, 8}, 3);
  std::vector<Activations*> batch{&pos, &neg};
  FirstBlockCache cache(1e9);  // computes the first call, skips the others
  const std::string second = "prefetch " + layer_unit(1), first = "prefetch " + noise_refiner_unit(0);
  for (int call = 0; call < 3; ++call) {
    store.events.clear();
    cache.forward(transformer, x, transformer.embed_timestep(0.1f * float(call), cx), batch, cx);
    const auto count = [&](const std::string& e) {
      return std::count(store.events.begin(), store.events.end(), e);
    };
    if (call == 0) {
      EXPECT_EQ(count("acquire " + layer_unit(1)), 2) << "call 0";
      EXPECT_EQ(count(second), 2) << "call 0";  // after the decision, and for the second sequence
    } else {
      EXPECT_EQ(count("acquire " + layer_unit(1)), 0) << "call " << call;
      EXPECT_EQ(count(second), 0) << "call " << call;
      ASSERT_FALSE(store.events.empty());
      // Each sequence's start asks for its first unit (2), the first sequence's layer 0 reads
      // ahead the second's start, the decision the next step's start.
      EXPECT_EQ(count(first), 4) << "call " << call;
    }
  }
  EXPECT_EQ(cache.computed(), 1);
  EXPECT_EQ(cache.skipped(), 2);
}

}  // namespace
}  // namespace klein::zimage
