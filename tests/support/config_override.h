#pragma once
// A weight store that serves another store's units under another model configuration (e.g.
// the tiny distilled klein as klein-base, to exercise classifier-free guidance). Header-only.
#include <utility>

#include "support/forwarding_store.h"

namespace klein::testing {

class ConfigOverride final : public ForwardingStore {
 public:
  ConfigOverride(WeightStore& inner, ModelConfig config)
      : ForwardingStore(inner), config_(std::move(config)) {}
  const ModelConfig& config() const override { return config_; }

 private:
  ModelConfig config_;
};

}  // namespace klein::testing
