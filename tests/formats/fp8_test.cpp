// FP8 weights in safetensors checkpoints (weights/fp8.h, docs/IMPORT.md): values decoded with
// their scales, companions consumed, malformed scales refused with the file and tensor named.
// Copies of the tiny model with some of its transformer's matrices rewritten as fp8.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "formats/st_files.h"
#include "support/testing.h"
#include "weights/model_source.h"
#include "weights/fp8.h"
#include "weights/source_store.h"

namespace klein {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::error_of;
using testing::StTensor;
using testing::TinyModelCopy;

const char* kTransformer = "transformer/diffusion_pytorch_model.safetensors";

using testing::test_name;

std::vector<std::byte> f32_bytes(const std::vector<float>& v) {
  std::vector<std::byte> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// x_embedder.weight [256, 128] as E4M3 codes: 1.0 (0x38) where row + column is even, -2.0
// (0xc0) where it is odd.
const int64_t kRows = 256, kCols = 128;
StTensor fp8_embedder(DType type = DType::F8_E4M3) {
  StTensor t{"x_embedder.weight", std::string(dtype_name(type)), {kRows, kCols}, {}};
  t.bytes.resize(size_t(kRows * kCols));
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      t.bytes[size_t(r * kCols + c)] = std::byte((r + c) % 2 ? 0xc0 : 0x38);
  return t;
}

// The tiny model with its transformer's tensors changed by `edit`.
class Fp8Model : public ::testing::Test {
 protected:
  Fp8Model() : copy_("fp8-" + test_name()) {}
  void write(const std::function<void(std::vector<StTensor>&)>& edit) {
    std::vector<StTensor> t = testing::read_all(testing::tiny_model() / kTransformer);
    for (auto it = t.begin(); it != t.end(); ++it)
      if (it->name == "x_embedder.weight") {
        t.erase(it);
        break;
      }
    edit(t);
    copy_.write_safetensors(kTransformer, t);
  }
  std::string error() {
    return error_of([&] { open_model(copy_.dir())->acquire("transformer.shared"); });
  }
  TinyModelCopy copy_;
};

// A scale per row of the embedder: (r + 1) / 64.
std::vector<float> row_scales() {
  std::vector<float> scale(kRows);
  for (int64_t r = 0; r < kRows; ++r) scale[size_t(r)] = float(r + 1) / 64.0f;
  return scale;
}

TEST_F(Fp8Model, PerRowScalesMultiplyTheDecodedCodes) {
  const std::vector<float> scale = row_scales();
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"x_embedder.weight_scale", "F32", {kRows, 1}, f32_bytes(scale)});
    t.push_back({"x_embedder.input_scale", "F32", {}, f32_bytes({0.25f})});
  });
  auto store = open_model(copy_.dir());
  const UnitRef u = store->acquire("transformer.shared");
  const Weight& w = u->get("x_embedder.weight");
  ASSERT_EQ(w.dtype, DType::F32);
  ASSERT_EQ(w.shape, (Shape{kRows, kCols}));
  const auto* v = static_cast<const float*>(w.data);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t c = 0; c < kCols; ++c)
      ASSERT_EQ(v[r * kCols + c], ((r + c) % 2 ? -2.0f : 1.0f) * scale[size_t(r)]) << r << "," << c;
  // The companions are consumed: not reported as unused tensors.
  EXPECT_THAT(store->origin().unused_tensors, ::testing::Not(::testing::Contains(HasSubstr("scale"))));
  EXPECT_EQ(store->origin().stored_types.at("transformer.x_embedder.weight"), DType::F8_E4M3);
}

// For convert the store hands fp8 weights out as stored, with their scale, so that no unit is
// held in float32; the codes and scales give the same values a slice at a time.
TEST_F(Fp8Model, AsStoredForConvertWithTheirScale) {
  const std::vector<float> scale = row_scales();
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"x_embedder.weight_scale", "F32", {kRows, 1}, f32_bytes(scale)});
  });
  auto store = open_model(copy_.dir());
  auto* source = dynamic_cast<SourceStore*>(store.get());
  ASSERT_NE(source, nullptr);
  // The unit's size follows what is held: the codes as float32 when decoded, else as stored.
  const uint64_t decoded = store->unit_bytes("transformer.shared");
  source->set_decode_fp8(false);
  EXPECT_EQ(decoded - store->unit_bytes("transformer.shared"), uint64_t(3 * kRows * kCols));
  const UnitRef u = store->acquire("transformer.shared");
  const Weight& w = u->get("x_embedder.weight");
  ASSERT_EQ(w.dtype, DType::F8_E4M3);
  ASSERT_EQ(w.nbytes, size_t(kRows * kCols));
  ASSERT_EQ(w.scale_count, kRows);
  std::vector<float> rows(size_t(2 * kCols));
  decode_fp8_rows(w.dtype, static_cast<const std::byte*>(w.data), 100, 102, kCols, w.scale,
                  w.scale_count, w.name, rows.data());
  EXPECT_EQ(rows[0], 1.0f * scale[100]);
  EXPECT_EQ(rows[1], -2.0f * scale[100]);
  EXPECT_EQ(rows[size_t(kCols)], -2.0f * scale[101]);
}

// A NaN code found by convert's slice reader: named with its row and column, nothing written.
TEST_F(Fp8Model, ConvertRefusesANaNCode) {
  write([&](std::vector<StTensor>& t) {
    StTensor e = fp8_embedder();
    e.bytes[size_t(200 * kCols + 7)] = std::byte(0xff);  // E4M3FN's negative NaN
    t.push_back(e);
  });
  const std::filesystem::path out = copy_.dir() / "out.klein";
  std::string log;
  EXPECT_NE(testing::run_klein("convert -m '" + copy_.dir().string() + "' -t q8 -q -o '" + out.string() + "'",
                               &log), 0);
  EXPECT_THAT(log, AllOf(HasSubstr("transformer.x_embedder.weight"), HasSubstr("row 200, column 7"),
                         HasSubstr(kTransformer)));
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST_F(Fp8Model, UnscaledE5M2) {
  write([&](std::vector<StTensor>& t) {
    StTensor e = fp8_embedder(DType::F8_E5M2);
    for (auto& b : e.bytes) b = std::byte(b == std::byte(0x38) ? 0x3c : 0xc0);  // 1.0, -2.0
    t.push_back(e);
  });
  auto store = open_model(copy_.dir());
  const UnitRef u = store->acquire("transformer.shared");
  const auto* v = static_cast<const float*>(u->get("x_embedder.weight").data);
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], -2.0f);
}

TEST_F(Fp8Model, ScaleOfTheWrongShape) {
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"x_embedder.scale_weight", "F32", {3}, f32_bytes({1, 1, 1})});
  });
  EXPECT_THAT(error(), AllOf(HasSubstr(kTransformer), HasSubstr("scale x_embedder.scale_weight has shape [3]"),
                             HasSubstr("expected [] or [1] (one scale) or [256] or [256, 1]")));
}

TEST_F(Fp8Model, MarkedScaledButAScaleIsMissing) {
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"scaled_fp8", "F8_E4M3", {0}, {}});
  });
  EXPECT_THAT(error(), AllOf(HasSubstr(kTransformer), HasSubstr("marked as scaled fp8 (scaled_fp8)"),
                             HasSubstr("fp8 tensor x_embedder.weight has no scale"),
                             HasSubstr("x_embedder.scale_weight")));
}

TEST_F(Fp8Model, NaNScale) {
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"x_embedder.scale_weight", "F32", {}, f32_bytes({std::numeric_limits<float>::quiet_NaN()})});
  });
  EXPECT_THAT(error(), AllOf(HasSubstr(kTransformer), HasSubstr("scale x_embedder.scale_weight holds nan")));
}

TEST_F(Fp8Model, ScaleOfAWeightThatIsNotFp8) {
  write([&](std::vector<StTensor>& t) {
    StTensor bf = fp8_embedder();
    bf.dtype = "BF16";
    bf.bytes.resize(bf.bytes.size() * 2);
    t.push_back(bf);
    t.push_back({"x_embedder.weight_scale", "F32", {}, f32_bytes({1})});
  });
  EXPECT_THAT(error(), HasSubstr("tensor x_embedder.weight is of type BF16 but has a scale "
                                 "(x_embedder.weight_scale)"));
}

TEST_F(Fp8Model, ScaleWithoutItsWeight) {
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    t.push_back({"proj_in.weight_scale", "F32", {}, f32_bytes({1})});
  });
  EXPECT_THAT(error(), HasSubstr("tensor proj_in.weight_scale is the scale of proj_in.weight, "
                                 "which the file does not hold"));
}

TEST_F(Fp8Model, OtherQuantizationFormatsAreNamed) {
  write([&](std::vector<StTensor>& t) {
    t.push_back(fp8_embedder());
    const std::string conf = R"({"format": "nvfp4"})";
    std::vector<std::byte> b(conf.size());
    std::memcpy(b.data(), conf.data(), b.size());
    t.push_back({"x_embedder.comfy_quant", "U8", {int64_t(b.size())}, b});
  });
  EXPECT_THAT(error(), HasSubstr("layer x_embedder is quantized as \"nvfp4\""));
}

TEST_F(Fp8Model, NaNCodeInAWeight) {
  write([&](std::vector<StTensor>& t) {
    StTensor e = fp8_embedder();
    e.bytes[size_t(3 * kCols + 5)] = std::byte(0x7f);  // E4M3FN's NaN
    t.push_back(e);
  });
  EXPECT_THAT(error(), AllOf(HasSubstr("tensor transformer.x_embedder.weight"),
                             HasSubstr("holds nan (row 3, column 5)")));
}

}  // namespace
}  // namespace klein
