// The Qwen3 text encoder against the official float32 run on the tiny model
// (testdata/klein-tiny/vectors/text_encoder), fed with the pipeline's own token ids.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "core/error.h"
#include "core/npy.h"
#include "ops/compute.h"
#include "models/qwen3/text_encoder.h"
#include "quant/matmul.h"
#include "support/forwarding_store.h"
#include "support/testing.h"
#include "support/tiny_model_suite.h"
#include "weights/model_source.h"

namespace klein::qwen3 {
namespace {

using klein::testing::matches_npy;
using klein::testing::tiny_model;
using klein::testing::tiny_vectors;

// The tolerance the test data's README proposes for a float32 engine with bf16 weights.
constexpr double kTol = 1e-4;

struct Tokens {
  std::vector<int32_t> ids, mask;
};

std::vector<int32_t> read_i32(const std::filesystem::path& path) {
  const std::vector<int64_t> wide = read_npy(path).to_i64();
  return {wide.begin(), wide.end()};
}

// The padded ids and mask the pipeline built for spec prompt n.
Tokens prompt_tokens(int n) {
  const auto dir = tiny_vectors() / "tokenizer";
  const std::string stem = "prompt" + std::to_string(n);
  return {read_i32(dir / (stem + "_input_ids.npy")),
          read_i32(dir / (stem + "_attention_mask.npy"))};
}

std::filesystem::path te_vector(const std::string& name) {
  return tiny_vectors() / "text_encoder" / name;
}

class TextEncoderGolden : public testing::TinyModelSuite {
};

TEST_F(TextEncoderGolden, EveryLayerOfPrompt0MatchesTheReference) {
  const Tokens t = prompt_tokens(0);
  const NpyArray all = read_npy(te_vector("prompt0_hidden_all.npy"));
  ASSERT_EQ(all.shape.size(), 3u);
  const int64_t rows = all.shape[1] * all.shape[2];
  const std::vector<float> ref = all.to_f32();

  Compute cx(2);
  TextEncoder encoder(*store_, cx);
  std::set<int64_t> seen;
  encoder.encode(t.ids, t.mask, [&](int64_t layer, const Tensor& x) {
    seen.insert(layer);
    ASSERT_LT(layer, all.shape[0] - 1) << "the last reference entry is the final norm";
    const double s = klein::testing::scaled_diff(x.data(), ref.data() + layer * rows, rows);
    EXPECT_LE(s, kTol) << "hidden state " << layer;
  });
  // hidden_states[0..27]: embeddings plus exactly the 27 decoder layers the pipeline reads.
  EXPECT_EQ(seen.size(), 28u);
  EXPECT_EQ(*seen.rbegin(), 27);
}

TEST_F(TextEncoderGolden, ContextAndSelectedLayersMatchForEveryPrompt) {
  Compute cx(2);
  TextEncoder encoder(*store_, cx);
  for (int n = 0; n < 3; ++n) {
    SCOPED_TRACE("prompt " + std::to_string(n));
    const Tokens t = prompt_tokens(n);
    std::map<int64_t, Tensor> kept;
    const Tensor ctx = encoder.encode(t.ids, t.mask, [&](int64_t layer, const Tensor& x) {
      if (layer != 9 && layer != 18 && layer != 27) return;
      Tensor copy(x.shape());
      std::memcpy(copy.data(), x.data(), size_t(x.numel()) * sizeof(float));
      kept.emplace(layer, std::move(copy));
    });
    const std::string stem = "prompt" + std::to_string(n);
    EXPECT_EQ(ctx.shape(), (Shape{512, 192}));
    EXPECT_TRUE(matches_npy(ctx, te_vector(stem + "_context.npy"), kTol));
    if (n == 2) continue;  // the long prompt comes with its context only
    ASSERT_EQ(kept.size(), 3u);
    for (const auto& [layer, x] : kept) {
      const auto ref = te_vector(stem + "_hidden_" + (layer < 10 ? "0" : "") +
                                 std::to_string(layer) + ".npy");
      EXPECT_TRUE(matches_npy(x, ref, kTol));
    }
  }
}

TEST_F(TextEncoderGolden, ResultDoesNotDependOnTheThreadCount) {
  const Tokens t = prompt_tokens(1);
  Compute one(1), three(3);
  const Tensor a = TextEncoder(*store_, one).encode(t.ids, t.mask);
  const Tensor b = TextEncoder(*store_, three).encode(t.ids, t.mask);
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), size_t(a.numel()) * sizeof(float)), 0);
}

TEST_F(TextEncoderGolden, RejectsMalformedInput) {
  Compute cx(1);
  TextEncoder encoder(*store_, cx);
  Tokens t = prompt_tokens(0);
  std::vector<int32_t> short_mask(t.mask.begin(), t.mask.end() - 1);
  EXPECT_THROW(encoder.encode(t.ids, short_mask), Error);
  t.ids[5] = 151936;  // one past the vocabulary
  try {
    encoder.encode(t.ids, t.mask);
    FAIL() << "an out-of-vocabulary id was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 151936 at position 5"), std::string::npos)
        << e.what();
  }
}

// A unit whose tensors live in memory it owns (here: a re-packed copy of a real tensor).
class OwnedUnit : public WeightUnit {
 public:
  OwnedUnit(std::string name, std::string prefix)
      : WeightUnit(std::move(name), std::move(prefix)) {}
  using WeightUnit::add;
  std::unique_ptr<std::byte[], FreeAligned> bytes;
};

// Forwards to the real store, but serves the token embedding table as Q8 in the layout the
// converter writes, as a converted model may hold it.
class Q8EmbeddingStore : public testing::ForwardingStore {
 public:
  explicit Q8EmbeddingStore(WeightStore& inner) : ForwardingStore(inner) {
    UnitRef real = inner.acquire("text_encoder.embed");
    Weight w = real->get("embed_tokens.weight");
    const std::vector<float> table = weight_to_floats(w);
    const auto layout = quant::Layout::Interleaved16;
    auto unit = std::make_shared<OwnedUnit>(real->name(), real->prefix());
    w.nbytes = quant::storage_bytes(DType::Q8, layout, w.rows(), w.cols());
    unit->bytes = alloc_aligned<std::byte>(w.nbytes);
    quant::pack(table.data(), w.rows(), w.cols(), DType::Q8, layout, unit->bytes.get());
    w.dtype = DType::Q8;
    w.layout = uint8_t(layout);
    w.data = unit->bytes.get();
    unit->add(w);
    embed_ = unit;
  }

  UnitRef acquire(const std::string& unit) override {
    return unit == "text_encoder.embed" ? embed_ : inner_.acquire(unit);
  }
  std::string identity() const override { return inner_.identity() + "+q8-embed"; }

 private:
  UnitRef embed_;
};

TEST_F(TextEncoderGolden, LooksUpRowsOfAQuantizedEmbeddingTable) {
  Q8EmbeddingStore store(*store_);
  Compute cx(2);
  TextEncoder encoder(store, cx);
  const Tokens t = prompt_tokens(0);
  const std::vector<float> ref = read_npy(te_vector("prompt0_hidden_all.npy")).to_f32();
  double embedding_diff = -1;
  const Tensor ctx = encoder.encode(t.ids, t.mask, [&](int64_t layer, const Tensor& x) {
    if (layer == 0) embedding_diff = klein::testing::scaled_diff(x.data(), ref.data(), x.numel());
  });
  // Q8 keeps each value within a step (max|w| of its 32-value block / 127; half a step plus
  // the rounding of the stored scale); a wrong row, or a row from the wrong tile, is off by
  // the size of the values themselves (scaled difference above 1).
  EXPECT_GE(embedding_diff, 0);
  EXPECT_LE(embedding_diff, 1.0 / 127);
  EXPECT_EQ(ctx.shape(), (Shape{512, 192}));
}

// Forwards to the real store and records how the encoder pages its units.
class RecordingStore : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  UnitRef acquire(const std::string& unit) override {
    std::lock_guard lock(mutex_);
    events.push_back("acquire " + unit);
    if (unit.starts_with("text_encoder.layer.")) {
      for (const auto& [name, ref] : held_)
        if (!ref.expired()) events.push_back("still held: " + name);
    }
    UnitRef real = inner_.acquire(unit);
    // A reference of our own whose expiry tells when the encoder let go of the unit.
    UnitRef mine(real.get(), [real](const WeightUnit*) {});
    held_[unit] = mine;
    return mine;
  }
  void prefetch(const std::string& unit) override {
    std::lock_guard lock(mutex_);
    events.push_back("prefetch " + unit);
  }

  std::vector<std::string> events;

 private:
  std::mutex mutex_;
  std::map<std::string, std::weak_ptr<const WeightUnit>> held_;
};

TEST_F(TextEncoderGolden, PagesOneLayerAtATimeAndNeverLoadsUnusedLayers) {
  RecordingStore store(*store_);
  Compute cx(1);
  TextEncoder encoder(store, cx);
  const Tokens t = prompt_tokens(0);
  encoder.encode(t.ids, t.mask);

  std::vector<std::string> expected = {"prefetch text_encoder.layer.0",
                                       "acquire text_encoder.embed"};
  for (int layer = 0; layer < 27; ++layer) {
    expected.push_back("acquire " + text_layer_unit(layer));
    if (layer + 1 < 27) expected.push_back("prefetch " + text_layer_unit(layer + 1));
  }
  EXPECT_EQ(store.events, expected);
}

}  // namespace
}  // namespace klein::qwen3
