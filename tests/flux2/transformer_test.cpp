// The transformer against single forward passes of the official model (vectors/transformer),
// including every intermediate the t2i_h64_w64 case stores.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/npy.h"
#include "flux2/official_forward.h"
#include "models/flux2/positions.h"
#include "models/flux2/transformer.h"
#include "support/testing.h"
#include "support/tiny_model_suite.h"
#include "weights/model_source.h"

namespace klein::flux2 {
namespace {

using testing::load_rows;

constexpr double kTolerance = 1e-4;  // max|diff| / max|ref|, README "Tolerances observed"

std::filesystem::path vector_path(const std::string& case_name, const std::string& what) {
  return testing::tiny_vectors() / "transformer" / (case_name + "_" + what + ".npy");
}

// Compares and prints the scaled difference, so a run documents how close every file is.
::testing::AssertionResult close_to(const float* got, int64_t n, const std::filesystem::path& ref) {
  const std::vector<float> r = read_npy(ref).to_f32();
  if (int64_t(r.size()) >= n)
    std::printf("  %-58s scaled diff %.3g\n", ref.filename().string().c_str(),
                testing::scaled_diff(got, r.data(), n));
  return testing::matches_npy(got, n, ref, kTolerance);
}

// The first n values against the first n of the reference (the pipeline keeps the target rows
// of an output that also has reference rows); the scale is max|ref| over those n values.
::testing::AssertionResult prefix_close_to(const float* got, int64_t n,
                                           const std::filesystem::path& ref) {
  const std::vector<float> r = read_npy(ref).to_f32();
  if (int64_t(r.size()) < n)
    return ::testing::AssertionFailure() << ref.filename() << " has only " << r.size() << " values";
  const double s = testing::scaled_diff(got, r.data(), n);
  std::printf("  %-58s scaled diff %.3g (first %lld values)\n", ref.filename().string().c_str(), s,
              static_cast<long long>(n));
  if (s <= kTolerance) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << ref.filename() << ": scaled diff " << s;
}

struct Case {
  std::string name;
  TokenLayout layout;
};

Case t2i_64x64() { return {"t2i_h64_w64", {512, {4, 4}, {}}}; }
Case t2i_64x96() { return {"t2i_h64_w96", {512, {4, 6}, {}}}; }
Case i2i_ref0() { return {"i2i_h64_w64_ref0", {512, {4, 4}, {{4, 5}}}}; }  // ref0 is 80x64 px

class TransformerTest : public testing::TinyModelSuite {
 protected:
  // Runs the case's forward pass; the target velocity goes to `velocity`.
  static std::vector<float> run(const Case& c, Compute& cx, const Observer& observe = {}) {
    Transformer model(*store_);
    return testing::official_forward(
        model, (testing::tiny_vectors() / "transformer" / (c.name + "_")).string(), c.layout, cx,
        observe);
  }
};

TEST(PositionIds, MatchThePipelineIds) {
  for (const Case& c : {t2i_64x64(), t2i_64x96(), i2i_ref0()}) {
    SCOPED_TRACE(c.name);
    const std::vector<int64_t> txt = read_npy(vector_path(c.name, "txt_ids")).to_i64();
    const std::vector<int64_t> img = read_npy(vector_path(c.name, "img_ids")).to_i64();
    const std::vector<PositionId> ids = joint_position_ids(c.layout);
    ASSERT_EQ(int64_t(ids.size()) * 4, int64_t(txt.size() + img.size()));
    for (size_t i = 0; i < ids.size(); ++i)
      for (size_t a = 0; a < 4; ++a) {
        const int64_t expected = i < txt.size() / 4 ? txt[i * 4 + a] : img[i * 4 + a - txt.size()];
        ASSERT_EQ(ids[i][a], expected) << "token " << i << " axis " << a;
      }
  }
}

TEST(PositionIds, ReferencesTakeTimeOffsetsTenApart) {
  const TokenLayout layout{3, {1, 2}, {{1, 1}, {2, 1}, {1, 1}}};
  const std::vector<PositionId> ids = image_position_ids(layout);
  ASSERT_EQ(ids.size(), 2u + 1u + 2u + 1u);
  EXPECT_EQ(ids[0], (PositionId{0, 0, 0, 0}));
  EXPECT_EQ(ids[1], (PositionId{0, 0, 1, 0}));
  EXPECT_EQ(ids[2], (PositionId{10, 0, 0, 0}));
  EXPECT_EQ(ids[3], (PositionId{20, 0, 0, 0}));
  EXPECT_EQ(ids[4], (PositionId{20, 1, 0, 0}));
  EXPECT_EQ(ids[5], (PositionId{30, 0, 0, 0}));
}

TEST_F(TransformerTest, RopeTablesMatch) {
  const Case c = t2i_64x64();
  const TransformerConfig& cfg = store_->config().transformer;
  const RopeTable rope(joint_position_ids(c.layout), cfg.rope_axes, cfg.rope_theta);
  const int64_t T = c.layout.text_tokens, N = c.layout.image_tokens(), D = cfg.head_dim;
  EXPECT_TRUE(close_to(rope.cos().row(0), T * D, vector_path(c.name, "rope_txt_cos")));
  EXPECT_TRUE(close_to(rope.sin().row(0), T * D, vector_path(c.name, "rope_txt_sin")));
  EXPECT_TRUE(close_to(rope.cos().row(T), N * D, vector_path(c.name, "rope_img_cos")));
  EXPECT_TRUE(close_to(rope.sin().row(T), N * D, vector_path(c.name, "rope_img_sin")));
}

TEST_F(TransformerTest, TimestepEmbeddingAndModulationMatch) {
  const Case c = t2i_64x64();
  Compute cx(2);
  Transformer model(*store_);
  Modulation mod(model.config());
  model.modulate(read_npy(vector_path(c.name, "timestep")).to_f32()[0], mod, cx);
  EXPECT_TRUE(
      close_to(mod.temb.data(), mod.temb.numel(), vector_path(c.name, "time_guidance_embed")));
  EXPECT_TRUE(close_to(mod.img.data(), mod.img.numel(),
                       vector_path(c.name, "double_stream_modulation_img")));
  EXPECT_TRUE(close_to(mod.txt.data(), mod.txt.numel(),
                       vector_path(c.name, "double_stream_modulation_txt")));
  EXPECT_TRUE(close_to(mod.single.data(), mod.single.numel(),
                       vector_path(c.name, "single_stream_modulation")));
}

TEST_F(TransformerTest, ContextEmbedderMatches) {
  const Case c = t2i_64x64();
  Compute cx(2);
  Transformer model(*store_);
  const Tensor context = load_rows(vector_path(c.name, "encoder_hidden_states"));
  const Tensor text = model.embed_text(context, cx);
  EXPECT_TRUE(close_to(text.data(), text.numel(), vector_path(c.name, "context_embedder")));
}

TEST_F(TransformerTest, TextToImage64x64MatchesEveryIntermediate) {
  const Case c = t2i_64x64();
  Compute cx(2);
  std::map<std::string, std::vector<float>> seen;
  auto record = [&](std::string_view name, const float* data, const Shape& s) {
    seen[std::string(name)].assign(data, data + numel(s));
  };
  const std::vector<float> v = run(c, cx, record);
  const std::vector<std::string> expected = {"x_embedder",
                                             "transformer_blocks.0.txt",
                                             "transformer_blocks.0.img",
                                             "transformer_blocks.1.txt",
                                             "transformer_blocks.1.img",
                                             "single_transformer_blocks.0",
                                             "single_transformer_blocks.1",
                                             "norm_out"};
  for (const std::string& name : expected) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(seen.count(name)) << "observer never saw " << name;
    std::string file = name;
    for (char& ch : file)
      if (ch == '.') ch = '_';
    EXPECT_TRUE(close_to(seen[name].data(), int64_t(seen[name].size()), vector_path(c.name, file)));
  }
  EXPECT_TRUE(close_to(v.data(), int64_t(v.size()), vector_path(c.name, "out")));
}

TEST_F(TransformerTest, TextToImage64x96Matches) {
  Compute cx(2);
  const std::vector<float> v = run(t2i_64x96(), cx);
  EXPECT_TRUE(close_to(v.data(), int64_t(v.size()), vector_path("t2i_h64_w96", "out")));
}

TEST_F(TransformerTest, OneReferenceMatchesOnTheTargetRows) {
  Compute cx(2);
  const std::vector<float> v = run(i2i_ref0(), cx);
  // The reference output has N_img + N_ref rows; the pipeline keeps the first N_img.
  EXPECT_TRUE(prefix_close_to(v.data(), int64_t(v.size()), vector_path("i2i_h64_w64_ref0", "out")));
}

TEST_F(TransformerTest, ResultDoesNotDependOnTheThreadCount) {
  Compute one(1), three(3);
  const std::vector<float> a = run(i2i_ref0(), one);
  const std::vector<float> b = run(i2i_ref0(), three);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "value " << i;
}

TEST_F(TransformerTest, SmallChunksGiveTheSameResult) {
  // The MLP chunking is a memory choice only: rows are independent after attention. (Not
  // bit-identical: the matrix kernels may sum in another order for another row count.)
  const Case c = i2i_ref0();
  Compute cx(2);
  Transformer model(*store_);
  const Tensor context = load_rows(vector_path(c.name, "encoder_hidden_states"));
  const Tensor hidden = load_rows(vector_path(c.name, "hidden_states"));
  Tensor ref({20, 128});
  std::memcpy(ref.data(), hidden.row(16), size_t(ref.numel()) * sizeof(float));
  const ReferenceTokens refs[] = {{&ref, {4, 5}}};
  const RopeTable rope(joint_position_ids(c.layout), model.config().rope_axes,
                       model.config().rope_theta);
  const Tensor text = model.embed_text(context, cx);
  const Tensor embedded = model.embed_references(refs, cx);
  Modulation mod(model.config());
  model.modulate(0.5f, mod, cx);
  Activations big(model.config(), c.layout), small(model.config(), c.layout, 7);
  EXPECT_LT(small.bytes(), big.bytes());
  std::vector<float> a(16 * 128), b(16 * 128);
  model.forward(hidden.data(), text, &embedded, mod, rope, big, a.data(), cx);
  model.forward(hidden.data(), text, &embedded, mod, rope, small, b.data(), cx);
  EXPECT_LE(testing::scaled_diff(b.data(), a.data(), int64_t(a.size())), 1e-6);
}

TEST_F(TransformerTest, ManyReferencesShareTheOneForward) {
  // Two references of different sizes: each changes the target's velocity.
  Compute cx(2);
  Transformer model(*store_);
  const Tensor context = load_rows(vector_path("i2i_h64_w64_ref0", "encoder_hidden_states"));
  const Tensor hidden = load_rows(vector_path("i2i_h64_w64_ref0", "hidden_states"));
  Tensor ref0({20, 128}), ref1({6, 128});
  std::memcpy(ref0.data(), hidden.row(16), size_t(ref0.numel()) * sizeof(float));
  std::memcpy(ref1.data(), hidden.row(0), size_t(ref1.numel()) * sizeof(float));
  const Tensor text = model.embed_text(context, cx);
  Modulation mod(model.config());
  model.modulate(0.8f, mod, cx);
  auto velocity = [&](std::vector<ReferenceTokens> refs) {
    TokenLayout layout{512, {4, 4}, {}};
    for (const auto& r : refs) layout.references.push_back(r.grid);
    const RopeTable rope(joint_position_ids(layout), model.config().rope_axes,
                         model.config().rope_theta);
    const Tensor embedded = model.embed_references(refs, cx);
    Activations act(model.config(), layout);
    std::vector<float> v(16 * 128);
    model.forward(hidden.data(), text, &embedded, mod, rope, act, v.data(), cx);
    return v;
  };
  const std::vector<float> none = velocity({});
  const std::vector<float> one = velocity({{&ref0, {4, 5}}});
  const std::vector<float> two = velocity({{&ref0, {4, 5}}, {&ref1, {2, 3}}});
  const std::vector<float> swapped = velocity({{&ref1, {2, 3}}, {&ref0, {4, 5}}});
  EXPECT_GT(testing::scaled_diff(one.data(), none.data(), 16 * 128), 1e-3);
  EXPECT_GT(testing::scaled_diff(two.data(), one.data(), 16 * 128), 1e-3);
  // Order matters: the references carry different time offsets.
  EXPECT_GT(testing::scaled_diff(two.data(), swapped.data(), 16 * 128), 1e-4);
  for (float x : two) ASSERT_TRUE(std::isfinite(x));
}

TEST_F(TransformerTest, ActivationPlanMatchesWhatIsAllocated) {
  const TransformerConfig& tiny = store_->config().transformer;
  const TokenLayout layout = i2i_ref0().layout;
  EXPECT_EQ(Activations::plan_bytes(tiny, layout), Activations(tiny, layout).bytes());
  EXPECT_EQ(Activations::plan_bytes(tiny, layout, 7), Activations(tiny, layout, 7).bytes());
  EXPECT_EQ(Activations::plan_bytes(tiny, layout, 512, 0, 3),
            Activations(tiny, layout, 512, 0, 3).bytes());
  // klein-4B at 1024x1024, text to image: S = 512 + 4096 rows; the MLP buffers hold the
  // longest chunk (512 rows and a rest of up to 31 rows joined to it).
  const TransformerConfig klein4b;  // the defaults are the klein-4B configuration
  const size_t bytes = Activations::plan_bytes(klein4b, {512, {64, 64}, {}});
  const size_t S = 4608, D = 3072, F = 9216, chunk = 512 + 31;
  EXPECT_EQ(bytes, (6 * S * D + chunk * (2 * F + D + F + D) + 128) * sizeof(float));
  // A batch of 4: four images' rows, and one image's Q, K, V and output for attention.
  EXPECT_EQ(Activations::plan_bytes(klein4b, {512, {64, 64}, {}}, 512, 0, 4),
            (6 * 4 * S * D + 4 * S * D + chunk * (2 * F + D + F + D) + 128) * sizeof(float));
  std::printf("  klein-4B 1024x1024 activations: %.1f MiB\n", double(bytes) / (1 << 20));
}

TEST_F(TransformerTest, RejectsAContextOfTheWrongWidth) {
  Compute cx(1);
  Transformer model(*store_);
  try {
    model.embed_text(Tensor::zeros({512, 100}), cx);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("192"), std::string::npos) << e.what();
  }
}

TEST_F(TransformerTest, RejectsReferenceTokensThatDoNotFitTheirGrid) {
  Compute cx(1);
  Transformer model(*store_);
  const Tensor tokens = Tensor::zeros({12, 128});
  const ReferenceTokens refs[] = {{&tokens, {4, 4}}};
  EXPECT_THROW(model.embed_references(refs, cx), Error);
}

}  // namespace
}  // namespace klein::flux2
