// A batch denoised together (flux2::sample_batch: each block once per step for all images,
// their rows stacked in every projection) gives every image the bits sample() gives it
// alone: on every instruction set, for float and Q4 weights, exact and fast arithmetic, with
// small images (their image rows projected one image at a time) and larger ones (stacked), a
// shared reference, and classifier-free guidance. Batches that do not share what they must
// are refused by name.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "models/flux2/sampler.h"
#include "pipeline/noise.h"
#include "support/isa.h"
#include "support/config_override.h"
#include "support/testing.h"
#include "support/tiny_container.h"
#include "weights/model_source.h"

namespace klein::flux2 {
namespace {

using testing::ConfigOverride;

Tensor gaussian(Shape shape, uint64_t seed) {
  Tensor t(std::move(shape));
  fill_gaussian(t, seed);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)) == 0;
}

struct Images {
  std::vector<Tensor> contexts, negatives, noise;
  Tensor reference;
};

// Text tokens of each image: the pipelines' 512 would be most of the work (the image has 16 to
// 64 tokens), and the batch code treats every length alike.
constexpr int64_t kTextTokens = 48;

// Three images: image 2 has image 0's prompt and its own noise.
Images make_images(const WeightStore& store, LatentGrid grid, bool with_reference) {
  const TransformerConfig& c = store.config().transformer;
  Images m;
  for (uint64_t i = 0; i < 3; ++i) {
    m.contexts.push_back(gaussian({kTextTokens, c.context_dim}, i == 2 ? 100 : 100 + i));
    m.negatives.push_back(gaussian({kTextTokens, c.context_dim}, 200 + i));
    m.noise.push_back(gaussian({grid.tokens(), c.in_channels}, 300 + i));
  }
  if (with_reference) m.reference = gaussian({4 * 5, c.in_channels}, 400);
  return m;
}

// Steps of every loop: one on the scalar path (slow; the loop itself is checked elsewhere).
int64_t steps_for(const Compute& cx) { return cx.isa() == quant::Isa::Scalar ? 1 : 2; }

SamplerInputs inputs_of(const WeightStore& store, const Images& m, size_t i, LatentGrid grid,
                        bool guided, int64_t steps) {
  SamplerInputs in;
  in.context = &m.contexts[i];
  in.negative_context = guided ? &m.negatives[i] : nullptr;
  in.noise = &m.noise[i];
  in.target = grid;
  if (m.reference.numel() > 0) in.references.push_back({&m.reference, {4, 5}});
  in.schedule = make_schedule(store.config().scheduler, grid.tokens(), steps);
  in.guidance = guided ? 3.0f : 1.0f;
  return in;
}

// Every image of a batch of three against the same image alone.
void expect_batch_is_alone(WeightStore& store, Compute& cx, LatentGrid grid, bool with_reference,
                           bool guided, const std::string& what) {
  const Images m = make_images(store, grid, with_reference);
  const int64_t steps = steps_for(cx);
  std::vector<SamplerInputs> batch;
  std::vector<int> steps_seen(3, 0);
  for (size_t i = 0; i < 3; ++i) {
    batch.push_back(inputs_of(store, m, i, grid, guided, steps));
    batch.back().on_step = [&steps_seen, i](const StepInfo& s) {
      EXPECT_EQ(s.step, steps_seen[i]);
      ++steps_seen[i];
    };
  }
  const std::vector<SamplerResult> together = sample_batch(store, batch, cx);
  ASSERT_EQ(together.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(steps_seen[i], steps) << what << " image " << i;
    const SamplerResult alone = sample(store, inputs_of(store, m, i, grid, guided, steps), cx);
    EXPECT_TRUE(same_bits(together[i].latents, alone.latents))
        << what << ": image " << i << " of the batch differs from the image made alone";
  }
  // Images 0 and 2 share the prompt, not the noise: a batch that mixed images up fails here.
  EXPECT_FALSE(same_bits(together[0].latents, together[2].latents)) << what;
}

class BatchDenoise : public testing::OnEveryIsa {
 protected:
  void run_all(WeightStore& store, const std::string& name) {
    Compute cx(2, isa());
    // The fast arithmetic differs from the exact one only with AMX or AVX-512 BF16.
    const bool has_fast = isa() == quant::Isa::Amx || isa() == quant::Isa::Avx512;
    for (const bool fast : {false, true}) {
      if (fast && !has_fast) continue;
      const Compute::Use arithmetic(cx, fast ? Arithmetic::fast() : Arithmetic::exact());
      const std::string what = name + (fast ? " fast" : " exact");
      // 4x4 tokens: fewer image rows than ops::kSamePathRows, projected image by image.
      expect_batch_is_alone(store, cx, {4, 4}, false, false, what + " 4x4");
      // 8x8 tokens with a reference: the image rows of all three stacked.
      expect_batch_is_alone(store, cx, {8, 8}, true, false, what + " 8x8 + reference");
    }
  }
};

TEST_P(BatchDenoise, FloatWeightsGiveEachImageItsOwnBits) {
  const auto store = open_model(testing::tiny_model());
  run_all(*store, "float");
}

TEST_P(BatchDenoise, Q4WeightsGiveEachImageItsOwnBits) {
  const auto store = open_model(testing::shared_tiny_container("q4"));
  run_all(*store, "q4");
}

TEST_P(BatchDenoise, GuidedBatchGivesEachImageItsOwnBits) {
  const auto inner = open_model(testing::shared_tiny_container("q4"));
  ModelConfig base = inner->config();
  base.is_distilled = false;
  ConfigOverride store(*inner, base);
  Compute cx(2, isa());
  const Compute::Use arithmetic(cx, Arithmetic::fast());
  expect_batch_is_alone(store, cx, {6, 8}, false, true, "q4 guided 6x8");
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(BatchDenoise);

TEST(BatchDenoiseErrors, WhatABatchMustShareIsCheckedByName) {
  const auto store = open_model(testing::tiny_model());
  Compute cx(1);
  const Images m = make_images(*store, {4, 4}, true);
  const Images other = make_images(*store, {4, 6}, false);
  const struct {
    std::string message;
    std::function<void(SamplerInputs&)> change;
  } cases[] = {
      {"target grid 4x6", [&](SamplerInputs& in) { in.target = {4, 6}; in.noise = &other.noise[1]; }},
      {"another schedule", [&](SamplerInputs& in) {
         in.schedule = make_schedule(store->config().scheduler, 16, 3);
       }},
      {"reference 0 differs", [&](SamplerInputs& in) { in.references[0].tokens = &m.noise[1]; }},
      {"1 references, image 0 has 0", [&](SamplerInputs& in) { in.references.resize(1); }},
  };
  for (const auto& c : cases) {
    std::vector<SamplerInputs> batch = {inputs_of(*store, m, 0, {4, 4}, false, 2),
                                        inputs_of(*store, m, 1, {4, 4}, false, 2)};
    if (c.message.starts_with("1 references")) batch[0].references.clear();
    c.change(batch[1]);
    try {
      sample_batch(*store, batch, cx);
      ADD_FAILURE() << "no error for: " << c.message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("batch image 1: "), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace klein::flux2
