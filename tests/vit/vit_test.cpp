// The safety classifier (models/vit, weights/safety_model.h) against the official code's
// vectors in ../shared/testdata/safety-tiny (transformers' image-classification pipeline on a
// tiny random ViT in the real checkpoint's layout): every case's loaded image, resize, pixel
// values, every layer, logits and probabilities, on every instruction set; and the checkpoints
// it must refuse.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "formats/image/preprocess.h"
#include "models/vit/preprocess.h"
#include "models/vit/safety.h"
#include "models/vit/vit.h"
#include "quant/matmul.h"
#include "support/forwarding_store.h"
#include "support/isa.h"
#include "support/testing.h"
#include "weights/safety_model.h"

namespace klein {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Activations and logits: float32 reference, other summation order (the README's 1e-4).
constexpr double kTolerance = 1e-4;

using testing::safety_dir;
fs::path safety_model_dir() { return safety_dir() / "model"; }
fs::path case_dir(const std::string& name) { return safety_dir() / "cases" / name; }

const std::vector<std::string>& case_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    const json m = json::parse(read_text_file(safety_dir() / "manifest.json"));
    for (const json& c : m["cases"]) out.push_back(c["name"].get<std::string>());
    return out;
  }();
  return names;
}

json case_json(const std::string& name) {
  return json::parse(read_text_file(case_dir(name) / "case.json"));
}

// An 8-bit [h, w, 3] .npy as an image.
Image image_npy(const fs::path& path) {
  const NpyArray a = read_npy(path);
  EXPECT_EQ(a.dtype, DType::U8) << path;
  EXPECT_EQ(a.shape.size(), 3u) << path;
  if (a.shape.size() != 3 || a.shape[2] != 3) return {};
  Image image(int(a.shape[1]), int(a.shape[0]));
  std::memcpy(image.rgb.data(), a.bytes.data(), image.rgb.size());
  return image;
}

// Equal pixels, or how many differ and by how much at most.
::testing::AssertionResult same_image(const Image& got, const Image& want) {
  if (got.width != want.width || got.height != want.height)
    return ::testing::AssertionFailure() << "size " << got.width << "x" << got.height
                                         << ", expected " << want.width << "x" << want.height;
  int64_t differ = 0;
  int worst = 0;
  for (size_t i = 0; i < got.rgb.size(); ++i)
    if (got.rgb[i] != want.rgb[i]) {
      ++differ;
      worst = std::max(worst, std::abs(int(got.rgb[i]) - int(want.rgb[i])));
    }
  if (differ == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << differ << " of " << got.rgb.size() << " values differ, by up to " << worst;
}

// The picture of a case as BFL hands it to the classifier: the file opened as load_image
// opens it, or the decoded tensor converted to 8 bits.
Image case_input(const std::string& name) {
  const json c = case_json(name);
  const fs::path input = case_dir(name) / c["input_file"].get<std::string>();
  if (input.extension() == ".npy") return tensor_to_image_truncated(read_npy(input).to_tensor());
  return load_image(input);
}

// The classifier the tests share, opened once.
const SafetyModel& tiny() {
  static const SafetyModel model = open_safety_model(safety_model_dir());
  return model;
}

// ---- Preprocessing: exact ------------------------------------------------------------------

TEST(SafetyPreprocess, LoadedImageIsTheOfficialOne) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Image want = image_npy(case_dir(name) / "image_rgb.npy");
    const Image got = case_input(name);
    const ::testing::AssertionResult same = same_image(got, want);
    std::cout << "  " << name << ": image_rgb " << (same ? "identical" : same.message()) << "\n";
    // Our JPEG decoder (libjpeg) is Pillow's; the orientation and size must be right anyway.
    EXPECT_TRUE(same);
  }
}

TEST(SafetyPreprocess, BilinearResizeIsPillows) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Image rgb = image_npy(case_dir(name) / "image_rgb.npy");
    const Image got = vit::resize_for_classifier(rgb, tiny().processor);
    EXPECT_TRUE(same_image(got, image_npy(case_dir(name) / "resized.npy")));
  }
}

TEST(SafetyPreprocess, PixelValuesAreExact) {
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const Tensor got =
        vit::pixel_values(image_npy(case_dir(name) / "image_rgb.npy"), tiny().processor);
    const NpyArray want = read_npy(case_dir(name) / "pixel_values.npy");
    ASSERT_EQ(want.shape, (Shape{1, 3, 224, 224}));
    ASSERT_EQ(got.shape(), (Shape{3, 224, 224}));
    const std::vector<float> ref = want.to_f32();
    double worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i)
      worst = std::max(worst, std::abs(double(got.data()[i]) - double(ref[size_t(i)])));
    EXPECT_EQ(worst, 0.0);
  }
}

// BFL's conversion truncates: 127.5 * (x + 1) for x = 0.999 is 254.87 -> 254, not 255.
TEST(SafetyPreprocess, DecodedTensorIsClampedScaledAndTruncated) {
  Tensor t({3, 1, 4});
  const float values[] = {-2.0f, 0.999f,   1.5f, NAN,   -1.0f, 0.0f,
                          1.0f,  -0.9999f, 0.5f, -0.5f, 0.2f,  0.99f};
  std::memcpy(t.data(), values, sizeof(values));
  const Image image = tensor_to_image_truncated(t);
  ASSERT_EQ(image.width, 4);
  ASSERT_EQ(image.height, 1);
  // Pixels (R, G, B) from the planes R = values[0..3], G = [4..7], B = [8..11].
  const uint8_t want[] = {0, 0, 191, 254, 127, 63, 255, 255, 153, 0, 0, 253};
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(int(image.rgb[i]), int(want[i])) << i;
  EXPECT_NE(testing::error_of([] { tensor_to_image_truncated(Tensor({4, 2, 2})); }), "");
}

// ---- The network, on every instruction set --------------------------------------------------

class SafetyGolden : public testing::OnEveryIsa {};

TEST_P(SafetyGolden, EveryLayerLogitsAndProbabilities) {
  Compute cx(2, isa());
  const SafetyModel& model = tiny();
  const VitConfig& c = model.config;
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const fs::path dir = case_dir(name);
    std::map<std::string, Tensor> seen;
    const Tensor pixels = [&] {
      Tensor t = read_npy(dir / "pixel_values.npy").to_tensor();
      t.reshape({3, c.image_size, c.image_size});
      return t;
    }();
    const vit::Classification out =
        vit::classify(*model.store, c, pixels, cx,
                      [&](const std::string& stage, const Tensor& x) { seen[stage] = x.copy(); });

    const int64_t T = c.tokens(), D = c.hidden;
    double worst = 0;  // over the token streams
    auto expect_stage = [&](const std::string& stage, const float* ref) {
      ASSERT_TRUE(seen.count(stage)) << stage << " was not reported";
      const double d = testing::scaled_diff(seen[stage].data(), ref, T * D);
      worst = std::max(worst, d);
      EXPECT_LE(d, kTolerance) << stage;
    };
    expect_stage("embeddings", read_npy(dir / "embeddings.npy").to_f32().data());
    const std::vector<float> hidden = read_npy(dir / "hidden_states.npy").to_f32();
    ASSERT_EQ(int64_t(hidden.size()), (c.num_layers + 1) * T * D);
    for (int64_t i = 1; i <= c.num_layers; ++i)
      expect_stage("layer." + std::to_string(i), hidden.data() + i * T * D);
    expect_stage("final_layernorm", read_npy(dir / "final_layernorm.npy").to_f32().data());

    EXPECT_TRUE(testing::matches_npy(out.logits.data(), int64_t(out.logits.size()),
                                     dir / "logits.npy", kTolerance));
    EXPECT_TRUE(testing::matches_npy(out.probs.data(), int64_t(out.probs.size()), dir / "probs.npy",
                                     kTolerance));
    const std::vector<float> logits = read_npy(dir / "logits.npy").to_f32();
    const std::vector<float> probs = read_npy(dir / "probs.npy").to_f32();
    std::cout << "  " << quant::isa_name(isa()) << " " << name << ": scaled diff, worst layer "
              << worst << ", logits " << testing::scaled_diff(out.logits.data(), logits.data(), 2)
              << ", probs " << testing::scaled_diff(out.probs.data(), probs.data(), 2) << "\n";

    const json cj = case_json(name);
    const vit::SafetyVerdict v = vit::judge(out, c);
    EXPECT_NEAR(v.nsfw, cj["nsfw_score"].get<double>(), 1e-5);
    EXPECT_EQ(v.flagged, cj["flagged"].get<bool>());
    EXPECT_EQ(v.label, cj["pipeline_scores"][0]["label"].get<std::string>());
  }
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(SafetyGolden);

// The classifier's store with every matrix (the dense layers, the patch projection, the
// classifier) stored as Q8 in the layout the converter writes, as a container would hold it.
class Q8Store : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  UnitRef acquire(const std::string& name) override {
    UnitRef real = inner_.acquire(name);
    auto unit = std::make_shared<Unit>(real->name(), real->prefix());
    for (Weight w : real->weights()) {
      if (w.shape.size() >= 2 && w.cols() % 32 == 0 && w.rows() > 1) {
        const std::vector<float> values = weight_to_floats(w);
        const auto layout =
            w.rows() % 16 == 0 ? quant::Layout::Interleaved16 : quant::Layout::RowMajor;
        w.nbytes = quant::storage_bytes(DType::Q8, layout, w.rows(), w.cols());
        unit->bytes.push_back(alloc_aligned<std::byte>(w.nbytes));
        quant::pack(values.data(), w.rows(), w.cols(), DType::Q8, layout, unit->bytes.back().get());
        w.dtype = DType::Q8;
        w.layout = uint8_t(layout);
        w.data = unit->bytes.back().get();
      }
      unit->add(w);
    }
    return unit;
  }
  std::string identity() const override { return inner_.identity() + "+q8"; }

 private:
  struct Unit : WeightUnit {
    Unit(std::string name, std::string prefix) : WeightUnit(std::move(name), std::move(prefix)) {}
    using WeightUnit::add;
    std::vector<std::unique_ptr<std::byte[], FreeAligned>> bytes;
  };
};

class SafetyQ8 : public testing::OnEveryIsa {};

// Q8 moves each weight by up to half a step of its block (max|w| / 254); the scores stay
// within a few thousandths of the official ones and every verdict is the official one (each
// case is at least 0.048 from the threshold).
TEST_P(SafetyQ8, EveryCaseKeepsItsVerdict) {
  Compute cx(2, isa());
  Q8Store store(*tiny().store);
  ASSERT_EQ(store.acquire(safety_layer_unit(0))->get("output.dense.weight").dtype, DType::Q8);
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    Tensor pixels = read_npy(case_dir(name) / "pixel_values.npy").to_tensor();
    pixels.reshape({3, 224, 224});
    const vit::Classification out = vit::classify(store, tiny().config, pixels, cx);
    const std::vector<float> probs = read_npy(case_dir(name) / "probs.npy").to_f32();
    const double d = testing::scaled_diff(out.probs.data(), probs.data(), 2);
    std::cout << "  " << quant::isa_name(isa()) << " Q8 " << name << ": probs scaled diff " << d
              << "\n";
    EXPECT_LE(d, 2e-2);
    EXPECT_EQ(vit::judge(out, tiny().config).flagged, case_json(name)["flagged"].get<bool>());
  }
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(SafetyQ8);

// From the file (or the decoded tensor) to the verdict, as `klein safety` runs it.
TEST(SafetyEndToEnd, EveryCaseFromItsInput) {
  Compute cx(2);
  for (const std::string& name : case_names()) {
    SCOPED_TRACE(name);
    const json cj = case_json(name);
    const vit::SafetyVerdict v =
        vit::judge(vit::classify_image(tiny(), case_input(name), cx), tiny().config);
    EXPECT_NEAR(v.nsfw, cj["nsfw_score"].get<double>(), 1e-5);
    EXPECT_EQ(v.flagged, cj["flagged"].get<bool>());
  }
}

TEST(SafetyVerdict, StrictlyAboveTheThreshold) {
  const VitConfig& c = tiny().config;
  vit::Classification s;
  s.logits = {0, 0};
  s.probs = {0.15f, 0.85f};  // the float nearest 0.85 is above 0.85 as a double
  s.probs[1] = std::nextafter(float(0.85), 0.0f);
  EXPECT_FALSE(vit::judge(s, c, 0.85).flagged);
  EXPECT_TRUE(vit::judge(s, c, 0.5).flagged);
  EXPECT_EQ(vit::judge(s, c, 0.5).label, "nsfw");
  s.probs = {1.0f, 0.0f};
  EXPECT_FALSE(vit::judge(s, c, 0.0).flagged);
  s.probs = {0.0f, 1.0f};
  EXPECT_FALSE(vit::judge(s, c, 1.0).flagged);
  for (double bad : {-0.01, 1.01, double(NAN)})
    EXPECT_NE(
        testing::error_of([&] { vit::check_threshold(bad, "--threshold"); }).find("outside [0, 1]"),
        std::string::npos)
        << bad;
}

// ---- What it refuses ----------------------------------------------------------------------

// A copy of the tiny model with config.json (or preprocessor_config.json) edited.
fs::path edited_model(const std::string& name, const std::function<void(json&)>& edit_config,
                      const std::function<void(json&)>& edit_processor = {}) {
  const fs::path dir = testing::temp_dir("safety-" + name);
  for (const char* f : {"config.json", "preprocessor_config.json", "model.safetensors"})
    fs::copy_file(safety_model_dir() / f, dir / f);
  json config = json::parse(read_text_file(dir / "config.json"));
  if (edit_config) edit_config(config);
  testing::write_text(dir / "config.json", config.dump(2));
  json processor = json::parse(read_text_file(dir / "preprocessor_config.json"));
  if (edit_processor) edit_processor(processor);
  testing::write_text(dir / "preprocessor_config.json", processor.dump(2));
  return dir;
}

std::string open_error(const fs::path& dir) {
  return testing::error_of([&] { open_safety_model(dir); });
}

TEST(SafetyRefuses, AnotherLabelSet) {
  const std::string e = open_error(edited_model("labels", [](json& j) {
    j["id2label"] = {{"0", "cat"}, {"1", "dog"}};
  }));
  EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  EXPECT_NE(e.find("\"cat\""), std::string::npos) << e;   // what was found
  EXPECT_NE(e.find("\"nsfw\""), std::string::npos) << e;  // what was expected
}

TEST(SafetyRefuses, AnActivationOtherThanGelu) {
  const std::string e =
      open_error(edited_model("act", [](json& j) { j["hidden_act"] = "gelu_new"; }));
  EXPECT_NE(e.find("hidden_act \"gelu_new\""), std::string::npos) << e;
}

TEST(SafetyRefuses, TensorsOfOtherShapes) {
  // The weights are of hidden 32: a config of 64 names the first tensor that disagrees.
  const std::string e = open_error(edited_model("hidden", [](json& j) { j["hidden_size"] = 64; }));
  EXPECT_NE(e.find("model.safetensors: tensor "), std::string::npos) << e;
  EXPECT_NE(e.find("; expected ["), std::string::npos) << e;
  EXPECT_NE(e.find("(hidden_size 64"), std::string::npos) << e;
  const std::string mlp =
      open_error(edited_model("mlp", [](json& j) { j["intermediate_size"] = 48; }));
  EXPECT_NE(mlp.find("intermediate.dense."), std::string::npos) << mlp;
  EXPECT_NE(mlp.find("; expected [48"), std::string::npos) << mlp;
}

TEST(SafetyRefuses, MissingAndUnexpectedTensors) {
  const std::string missing =
      open_error(edited_model("deeper", [](json& j) { j["num_hidden_layers"] = 3; }));
  EXPECT_NE(missing.find("tensor vit.encoder.layer.2."), std::string::npos) << missing;
  EXPECT_NE(missing.find("is missing"), std::string::npos) << missing;
  const std::string extra =
      open_error(edited_model("shallower", [](json& j) { j["num_hidden_layers"] = 1; }));
  EXPECT_NE(extra.find("tensor vit.encoder.layer.1."), std::string::npos) << extra;
  EXPECT_NE(extra.find("another layout"), std::string::npos) << extra;
}

TEST(SafetyRefuses, OtherPreprocessing) {
  const std::string resample =
      open_error(edited_model("resample", {}, [](json& j) { j["resample"] = 3; }));
  EXPECT_NE(resample.find("preprocessor_config.json: resample 3"), std::string::npos) << resample;
  const std::string size = open_error(edited_model("size", {}, [](json& j) {
    j["size"] = {{"shortest_edge", 224}};
  }));
  EXPECT_NE(size.find("expected {\"height\""), std::string::npos) << size;
  const std::string type = open_error(edited_model(
      "fast", {}, [](json& j) { j["image_processor_type"] = "ViTImageProcessorFast"; }));
  EXPECT_NE(type.find("ViTImageProcessorFast"), std::string::npos) << type;
}

TEST(SafetyRefuses, AModelThatIsNotAViT) {
  const std::string e = open_error(edited_model("type", [](json& j) { j["model_type"] = "deit"; }));
  EXPECT_NE(e.find("model_type \"deit\""), std::string::npos) << e;
  const std::string none = open_error(testing::temp_dir("safety-empty"));
  EXPECT_NE(none.find("config.json: missing"), std::string::npos) << none;
}

}  // namespace
}  // namespace klein
