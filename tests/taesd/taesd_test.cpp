// The tiny autoencoders against madebyollin/taesd's own taesd.py: every layer of TAEF2's
// decoder and encoder on the published weights (.pth), and of a TAEF1-shaped network with
// seeded random weights (decoder from .safetensors, encoder from .pth), on every instruction
// set, within 1e-4 of the largest reference value. The references are
// tests/data/taef2/ref, written by tools/refgen/taesd/make_reference.py (Debian's torch 1.13).
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "core/npy.h"
#include "models/taesd/taesd.h"
#include "support/isa.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

constexpr double kLayerBound = 1e-4;

fs::path data_dir() { return fs::path(KLEIN_SOURCE_DIR) / "tests" / "data" / "taef2"; }
fs::path ref(const std::string& name) { return data_dir() / "ref" / (name + ".npy"); }

// The reference files "<prefix>_NN.npy" of one network's layers: NN -> path.
std::map<int, fs::path> reference_layers(const std::string& prefix) {
  std::map<int, fs::path> out;
  for (const auto& e : fs::directory_iterator(data_dir() / "ref")) {
    const std::string stem = e.path().stem().string();
    if (!stem.starts_with(prefix + "_") || stem.ends_with("_in")) continue;
    out[std::stoi(stem.substr(prefix.size() + 1))] = e.path();
  }
  return out;
}

// Every reported layer against its reference, and every reference layer reported.
void expect_layers(const std::map<std::string, Tensor>& got, const std::string& half,
                   const std::string& prefix) {
  const std::map<int, fs::path> want = reference_layers(prefix);
  ASSERT_FALSE(want.empty()) << prefix;
  double worst = 0;
  for (const auto& [layer, path] : want) {
    const std::string name = half + "." + std::to_string(layer);
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << name << " was not reported";
      continue;
    }
    const NpyArray expected = read_npy(path);
    ASSERT_EQ(expected.shape, it->second.shape()) << name;
    const std::vector<float> values = expected.to_f32();
    const double diff = testing::scaled_diff(it->second.data(), values.data(), int64_t(values.size()));
    EXPECT_LE(diff, kLayerBound) << name << " against " << path.filename().string();
    worst = std::max(worst, diff);
  }
  EXPECT_EQ(got.size(), want.size()) << "layers reported without a reference";
  std::cout << "  " << prefix << ": " << want.size() << " layers, worst scaled diff " << worst
            << "\n";
}

taesd::Observer keep(std::map<std::string, Tensor>& layers) {
  return [&layers](const std::string& name, const Tensor& value) { layers[name] = value.copy(); };
}

class TinyAutoencoder : public testing::OnEveryIsa {};

TEST_P(TinyAutoencoder, Taef2DecoderMatchesTaesdPy) {
  const taesd::TinyDecoder decoder(data_dir() / "taef2_decoder.pth", taesd::kTaef2LatentChannels);
  EXPECT_TRUE(decoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor image = decoder.decode(read_npy(ref("taef2_dec_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(image.shape(), (Shape{3, 16, 24}));
  expect_layers(layers, "decoder", "taef2_dec");
}

TEST_P(TinyAutoencoder, Taef2EncoderMatchesTaesdPy) {
  const taesd::TinyEncoder encoder(data_dir() / "taef2_encoder.pth", taesd::kTaef2LatentChannels);
  EXPECT_TRUE(encoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor latents = encoder.encode(read_npy(ref("taef2_enc_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(latents.shape(), (Shape{32, 2, 3}));
  expect_layers(layers, "encoder", "taef2_enc");
}

TEST_P(TinyAutoencoder, Taef1ShapedDecoderMatchesTaesdPy) {
  const taesd::TinyDecoder decoder(data_dir() / "taef1_random_decoder.safetensors",
                                   taesd::kTaef1LatentChannels);
  EXPECT_FALSE(decoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor image = decoder.decode(read_npy(ref("taef1_dec_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(image.shape(), (Shape{3, 8, 16}));
  expect_layers(layers, "decoder", "taef1_dec");
}

TEST_P(TinyAutoencoder, Taef1ShapedEncoderMatchesTaesdPy) {
  const taesd::TinyEncoder encoder(data_dir() / "taef1_random_encoder.pth",
                                   taesd::kTaef1LatentChannels);
  EXPECT_FALSE(encoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor latents = encoder.encode(read_npy(ref("taef1_enc_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(latents.shape(), (Shape{16, 1, 2}));
  expect_layers(layers, "encoder", "taef1_enc");
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(TinyAutoencoder);

}  // namespace
}  // namespace klein
