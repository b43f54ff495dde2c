// The tiny autoencoders against madebyollin/taesd's own taesd.py: every layer of TAEF2's
// decoder and encoder on the published weights (.pth), and of a TAEF1-shaped network with
// seeded random weights (decoder from .safetensors, encoder from .pth), on every instruction
// set, within 1e-4 of the largest reference value. The references are
// tests/data/taef2/ref, written by tools/refgen/taesd/make_reference.py (Debian's torch 1.13).
#include <gtest/gtest.h>

#include <random>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "core/files.h"
#include "core/npy.h"
#include "formats/image/image.h"
#include "models/taesd/taesd.h"
#include "support/isa.h"
#include "support/testing.h"

namespace klein {
namespace {

namespace fs = std::filesystem;

constexpr double kLayerBound = 1e-4;

using testing::taef2_dir;
fs::path ref(const std::string& name) { return taef2_dir() / "ref" / (name + ".npy"); }

// The reference files "<prefix>_NN.npy" of one network's layers: NN -> path.
std::map<int, fs::path> reference_layers(const std::string& prefix) {
  std::map<int, fs::path> out;
  for (const auto& e : fs::directory_iterator(taef2_dir() / "ref")) {
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
    const double diff =
        testing::scaled_diff(it->second.data(), values.data(), int64_t(values.size()));
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
  const taesd::TinyDecoder decoder(taef2_dir() / "taef2_decoder.pth", taesd::kTaef2LatentChannels);
  EXPECT_TRUE(decoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor image = decoder.decode(read_npy(ref("taef2_dec_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(image.shape(), (Shape{3, 16, 24}));
  expect_layers(layers, "decoder", "taef2_dec");
}

// Layers 8-19 on bands of the 2h plane (what decode does without an observer): every output
// row with the bits of the whole-plane decode, whatever the band height (two rows of 2h, rows
// that do not divide the plane, one band for all), and the reference's final image with them.
TEST_P(TinyAutoencoder, BandedDecodeHasTheWholeDecodesBits) {
  const taesd::TinyDecoder decoder(taef2_dir() / "taef2_decoder.pth", taesd::kTaef2LatentChannels);
  Compute cx(2, isa());
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  Tensor z({32, 11, 6});
  for (int64_t i = 0; i < z.numel(); ++i) z.data()[i] = normal(rng);
  std::map<std::string, Tensor> layers;
  const Tensor whole = decoder.decode(z, cx, keep(layers));  // an observer: the whole planes
  ASSERT_EQ(whole.shape(), (Shape{3, 88, 48}));
  for (int64_t rows : {2, 5, 100}) {
    const Tensor banded = decoder.decode(z, cx, {}, rows);
    ASSERT_EQ(banded.shape(), whole.shape()) << rows;
    int64_t differ = 0;
    for (int64_t i = 0; i < whole.numel(); ++i) differ += banded.data()[i] != whole.data()[i];
    EXPECT_EQ(differ, 0) << "rows " << rows << ": " << differ << " values differ";
  }
  // The default bands (one, at this size) on the reference's latents: taesd.py's image.
  layers.clear();
  const Tensor image = decoder.decode(read_npy(ref("taef2_dec_in")).to_tensor(), cx);
  const std::vector<float> want = read_npy(ref("taef2_dec_19")).to_f32();
  EXPECT_LE(testing::scaled_diff(image.data(), want.data(), int64_t(want.size())), kLayerBound);
}

TEST_P(TinyAutoencoder, Taef2EncoderMatchesTaesdPy) {
  const taesd::TinyEncoder encoder(taef2_dir() / "taef2_encoder.pth", taesd::kTaef2LatentChannels);
  EXPECT_TRUE(encoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor latents =
      encoder.encode(read_npy(ref("taef2_enc_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(latents.shape(), (Shape{32, 2, 3}));
  expect_layers(layers, "encoder", "taef2_enc");
}

TEST_P(TinyAutoencoder, Taef1ShapedDecoderMatchesTaesdPy) {
  const taesd::TinyDecoder decoder(taef2_dir() / "taef1_random_decoder.safetensors",
                                   taesd::kTaef1LatentChannels);
  EXPECT_FALSE(decoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor image = decoder.decode(read_npy(ref("taef1_dec_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(image.shape(), (Shape{3, 8, 16}));
  expect_layers(layers, "decoder", "taef1_dec");
}

TEST_P(TinyAutoencoder, Taef1ShapedEncoderMatchesTaesdPy) {
  const taesd::TinyEncoder encoder(taef2_dir() / "taef1_random_encoder.pth",
                                   taesd::kTaef1LatentChannels);
  EXPECT_FALSE(encoder.mid_block_norm());
  Compute cx(2, isa());
  std::map<std::string, Tensor> layers;
  const Tensor latents =
      encoder.encode(read_npy(ref("taef1_enc_in")).to_tensor(), cx, keep(layers));
  EXPECT_EQ(latents.shape(), (Shape{16, 1, 2}));
  expect_layers(layers, "encoder", "taef1_enc");
}

// Mean SSIM of two [C, H, W] images in [0, 1] as make_reference.py computes it: Gaussian window
// 11x11 (sigma 1.5) over the valid positions, per channel, averaged; in double.
double ssim(const std::vector<double>& a, const std::vector<double>& b, int64_t C, int64_t H,
            int64_t W) {
  double g[11], sum = 0;
  for (int i = 0; i < 11; ++i) sum += g[i] = std::exp(-double((i - 5) * (i - 5)) / (2 * 1.5 * 1.5));
  for (double& v : g) v /= sum;
  const int64_t h = H - 10, w = W - 10;
  auto blur = [&](const std::vector<double>& x) {  // [H, W] -> [h, w]
    std::vector<double> rows(size_t(H * w)), out(size_t(h * w));
    for (int64_t y = 0; y < H; ++y)
      for (int64_t j = 0; j < w; ++j) {
        double s = 0;
        for (int k = 0; k < 11; ++k) s += g[k] * x[size_t(y * W + j + k)];
        rows[size_t(y * w + j)] = s;
      }
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = 0; j < w; ++j) {
        double s = 0;
        for (int k = 0; k < 11; ++k) s += g[k] * rows[size_t((i + k) * w + j)];
        out[size_t(i * w + j)] = s;
      }
    return out;
  };
  const double c1 = 0.01 * 0.01, c2 = 0.03 * 0.03;
  double total = 0;
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> p(a.begin() + c * H * W, a.begin() + (c + 1) * H * W);
    std::vector<double> q(b.begin() + c * H * W, b.begin() + (c + 1) * H * W);
    std::vector<double> pp(p.size()), qq(p.size()), pq(p.size());
    for (size_t i = 0; i < p.size(); ++i)
      pp[i] = p[i] * p[i], qq[i] = q[i] * q[i], pq[i] = p[i] * q[i];
    const auto mp = blur(p), mq = blur(q), spp = blur(pp), sqq = blur(qq), spq = blur(pq);
    double s = 0;
    for (size_t i = 0; i < mp.size(); ++i) {
      const double vp = spp[i] - mp[i] * mp[i], vq = sqq[i] - mq[i] * mq[i],
                   cov = spq[i] - mp[i] * mq[i];
      s += ((2 * mp[i] * mq[i] + c1) * (2 * cov + c2)) /
           ((mp[i] * mp[i] + mq[i] * mq[i] + c1) * (vp + vq + c2));
    }
    total += s / double(mp.size());
  }
  return total / double(C);
}

// A real photograph (NASA's public-domain portrait of Eileen Collins, 128x128) through TAEF2's
// published encoder and decoder comes back as taesd.py brings it back: PSNR within 0.05 dB,
// SSIM within 1e-3. On the best instruction set only (the scalar path takes a second here; every
// path's layers are checked above).
TEST(TinyAutoencoderPhoto, Taef2RoundTripAsTaesdPy) {
  const nlohmann::json want =
      nlohmann::json::parse(read_text_file(taef2_dir() / "ref" / "photo.json"));
  const Image photo = load_image(taef2_dir() / want.at("image").get<std::string>());
  const int64_t H = photo.height, W = photo.width;
  Tensor x({3, H, W});
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t i = 0; i < H * W; ++i)
      x.data()[c * H * W + i] = float(photo.rgb[size_t(i * 3 + c)]) / 255.0f;
  Compute cx(2);
  const Tensor latents = taesd::TinyEncoder(taef2_dir() / "taef2_encoder.pth").encode(x, cx);
  const Tensor y = taesd::TinyDecoder(taef2_dir() / "taef2_decoder.pth").decode(latents, cx);
  ASSERT_EQ(y.shape(), x.shape());
  std::vector<double> a(size_t(x.numel())), b(a.size());
  double mse = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = x.data()[i];
    b[i] = std::clamp(double(y.data()[i]), 0.0, 1.0);
    mse += (a[i] - b[i]) * (a[i] - b[i]);
  }
  const double psnr = 10 * std::log10(1.0 / (mse / double(a.size())));
  const double s = ssim(b, a, 3, H, W);
  std::cout.precision(8);
  std::cout << "  PSNR " << psnr << " dB (taesd.py " << want.at("psnr_db").get<double>()
            << "), SSIM " << s << " (taesd.py " << want.at("ssim").get<double>() << ")\n";
  EXPECT_NEAR(psnr, want.at("psnr_db").get<double>(), 0.05);
  EXPECT_NEAR(s, want.at("ssim").get<double>(), 1e-3);
}

KLEIN_INSTANTIATE_ON_EVERY_ISA(TinyAutoencoder);

}  // namespace
}  // namespace klein
