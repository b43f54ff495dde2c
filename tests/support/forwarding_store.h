#pragma once
// A weight store that serves another store's units: the base of the tests' stores that record,
// convert or relabel what the code under test asks of a real one. It forwards what every store
// must answer; the rest keeps WeightStore's defaults unless a test's store says otherwise.
// Header-only.
#include <string>
#include <vector>

#include "weights/weight_store.h"

namespace klein::testing {

class ForwardingStore : public WeightStore {
 public:
  explicit ForwardingStore(WeightStore& inner) : inner_(inner) {}
  UnitRef acquire(const std::string& unit) override { return inner_.acquire(unit); }
  bool has_unit(const std::string& unit) const override { return inner_.has_unit(unit); }
  std::vector<std::string> units() const override { return inner_.units(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::string identity() const override { return inner_.identity(); }

 protected:
  WeightStore& inner_;
};

}  // namespace klein::testing
