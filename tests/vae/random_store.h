#pragma once
// An in-memory weight store holding only the VAE, with random BF16 weights of the shapes a
// VaeConfig implies (klein's real [128, 256, 512, 512] by default): for speed and memory
// measurements at full size without the real checkpoint. With u uniform of unit variance
// (on [-√3, √3], cheap to draw for 84M values), scales keep activations O(1):
//   conv [out, in, k, k]: u/sqrt(in·k·k) (0.5× for decoder.conv_out); linear [out, in]:
//   u/sqrt(in); norm weights 1 + 0.1·u; biases 0.02·u; bn mean 0.3·u, var exp(0.4·u).
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "weights/expected.h"
#include "weights/weight_store.h"

namespace klein::testing {

class RandomVaeUnit final : public WeightUnit {
 public:
  RandomVaeUnit(const std::string& name, const ShapeMap& all, const std::vector<std::string>& starts,
                uint64_t seed)
      : WeightUnit(name, "vae.") {
    for (const auto& [full, shape] : all) {
      bool mine = false;
      for (const std::string& s : starts) mine = mine || full.rfind(s, 0) == 0;
      if (!mine) continue;
      storage_.push_back(draw(full, shape, seed));
      Weight w;
      w.name = full;
      w.dtype = DType::BF16;
      w.shape = shape;
      w.data = storage_.back().data();
      w.nbytes = storage_.back().size() * sizeof(uint16_t);
      add(std::move(w));
    }
  }

 private:
  static std::vector<uint16_t> draw(const std::string& name, const Shape& shape, uint64_t seed) {
    // splitmix64, one stream per tensor name.
    uint64_t state = seed ^ std::hash<std::string>{}(name);
    auto u = [&state]() {
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const float unit = float(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      return (2.0f * unit - 1.0f) * 1.7320508f;
    };
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    std::function<float()> value;
    if (ends_with("bn.running_mean")) {
      value = [&] { return 0.3f * u(); };
    } else if (ends_with("bn.running_var")) {
      value = [&] { return std::exp(0.4f * u()); };
    } else if (ends_with(".bias")) {
      value = [&] { return 0.02f * u(); };
    } else if (shape.size() == 1) {
      value = [&] { return 1.0f + 0.1f * u(); };
    } else {
      const float fan_in = float(numel(shape) / shape[0]);
      const float gain = ends_with("decoder.conv_out.weight") ? 0.5f : 1.0f;
      value = [&, s = gain / std::sqrt(fan_in)] { return s * u(); };
    }
    std::vector<uint16_t> out(static_cast<size_t>(numel(shape)));
    for (auto& v : out) v = f32_to_bf16(value());
    return out;
  }

  std::vector<std::vector<uint16_t>> storage_;
};

class RandomVaeStore final : public WeightStore {
 public:
  explicit RandomVaeStore(const VaeConfig& vae = {}, uint64_t seed = 1) {
    config_.vae = vae;
    config_.name = "random-vae";
    const ShapeMap all = expected_vae(vae);
    encoder_ = std::make_shared<RandomVaeUnit>("vae.encoder", all,
                                               std::vector<std::string>{"vae.encoder.", "vae.quant_conv."}, seed);
    decoder_ = std::make_shared<RandomVaeUnit>(
        "vae.decoder", all, std::vector<std::string>{"vae.decoder.", "vae.post_quant_conv."}, seed);
    stats_ = std::make_shared<RandomVaeUnit>("vae.latent_stats", all,
                                             std::vector<std::string>{"vae.bn."}, seed);
  }

  UnitRef acquire(const std::string& unit) override {
    if (unit == "vae.encoder") return encoder_;
    if (unit == "vae.decoder") return decoder_;
    if (unit == "vae.latent_stats") return stats_;
    fail("random VAE store has no unit ", unit);
  }
  bool has_unit(const std::string& unit) const override {
    return unit == "vae.encoder" || unit == "vae.decoder" || unit == "vae.latent_stats";
  }
  std::vector<std::string> units() const override {
    return {"vae.encoder", "vae.decoder", "vae.latent_stats"};
  }
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return "random-vae"; }

 private:
  ModelConfig config_;
  UnitRef encoder_, decoder_, stats_;
};

}  // namespace klein::testing
