#pragma once
// A weight store that serves another store's units under another model configuration (e.g.
// the tiny distilled klein as klein-base, to exercise classifier-free guidance). Header-only.
#include <string>
#include <utility>
#include <vector>

#include "weights/weight_store.h"

namespace klein::testing {

class ConfigOverride final : public WeightStore {
 public:
  ConfigOverride(WeightStore& inner, ModelConfig config)
      : inner_(inner), config_(std::move(config)) {}
  UnitRef acquire(const std::string& unit) override { return inner_.acquire(unit); }
  bool has_unit(const std::string& unit) const override { return inner_.has_unit(unit); }
  std::vector<std::string> units() const override { return inner_.units(); }
  const ModelConfig& config() const override { return config_; }
  std::string identity() const override { return inner_.identity(); }

 private:
  WeightStore& inner_;
  ModelConfig config_;
};

}  // namespace klein::testing
